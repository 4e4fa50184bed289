#include "tanh.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <string>

namespace torchneuron::kernels {
namespace {

bool read_option() {
  const char* v = std::getenv("TORCHNEURON_DEVICE_TANH");
  const std::string text = v ? v : "";
  TORCH_CHECK_VALUE(text.empty() || text == "0" || text == "1", "TORCHNEURON_DEVICE_TANH='", text,
                    "' is invalid: 1 selects the device's own float32 tanh, 0 (or unset) the CPU's");
  return text == "1";
}

} // namespace

bool device_tanh_selected() {
  static const bool selected = read_option();  // a throw leaves it unset: the next call throws again
  return selected;
}

} // namespace torchneuron::kernels
