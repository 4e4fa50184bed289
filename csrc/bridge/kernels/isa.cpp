#include "isa.h"

#include "tanh.h"

#include <ATen/Version.h>  // get_cpu_capability

#include <string>

namespace torchneuron::isa {
namespace {

// What ATen itself requires of the host for its AVX2 and AVX512 capabilities.
#if defined(__x86_64__)
bool host_has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
}
bool host_has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#endif

} // namespace

const char* host_level() {
#if defined(__x86_64__)
  if (host_has_avx512()) return kAvx512.name;
  if (host_has_avx2()) return kAvx2.name;
#endif
  return kPortable.name;
}

const Kernels& kernels() {
  static const Kernels& chosen = []() -> const Kernels& {
#if defined(__x86_64__)
    // ATen takes ATEN_CPU_CAPABILITY at its word; a level the host lacks is
    // never run here.
    const std::string aten = at::get_cpu_capability();
    if (aten == "AVX512" && host_has_avx512()) return kAvx512;
    if ((aten == "AVX512" || aten == "AVX2") && host_has_avx2()) return kAvx2;
#endif
    return kPortable;
  }();
  return chosen;
}

} // namespace torchneuron::isa

namespace torchneuron::kernels {

void tanh_float(float* out, const float* x, int64_t n) { isa::kernels().tanh_float(out, x, n); }

} // namespace torchneuron::kernels
