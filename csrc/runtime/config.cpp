#include "config.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <limits>

#include <unistd.h>

#include "errors.h"

namespace torchneuron::runtime {
namespace {

// Cores a NeuronCore runtime can name (a trn2 host has 128).
constexpr int kMaxCoreId = 127;

[[noreturn]] void bad(const char* variable, const std::string& text,
                      const std::string& why) {
  throw ConfigError(std::string(variable) + "='" + text + "' is invalid: " + why);
}

std::string gib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", double(bytes) / double(1ull << 30));
  return buf;
}

int parse_core(const std::string& whole, const std::string& part) {
  if (part.empty() || !std::all_of(part.begin(), part.end(), ::isdigit))
    bad("NEURON_RT_VISIBLE_CORES", whole,
        "expected core ids such as '0-3' or '0,2', got '" + part + "'");
  int id = std::stoi(part.size() > 4 ? "99999" : part);
  if (id > kMaxCoreId)
    bad("NEURON_RT_VISIBLE_CORES", whole,
        "core id " + part + " is above " + std::to_string(kMaxCoreId));
  return id;
}

} // namespace

Machine parse_machine(const std::string& text, const char* variable) {
  std::string k;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c)) && c != '_') k += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  constexpr size_t GiB = 1ull << 30;
  auto is = [&](std::initializer_list<const char*> names) {
    return std::find(names.begin(), names.end(), k) != names.end();
  };
  // Device HBM over cores per device, from AWS's architecture guides; LNC=2 is
  // the default from Trainium2 on, and Trainium1 supports LNC=1 only (AWS's
  // logical NeuronCore configuration page and compiler error EARG001).
  if (is({"trn2", "trainium2", "gen3", "v3", "neuroncore-v3", "nc3"})) return {"trn2", "NeuronCore-v3", 8, 96 * GiB / 8, 2, 2};
  if (is({"trn3", "trainium3", "gen4", "v4", "neuroncore-v4", "nc4"})) return {"trn3", "NeuronCore-v4", 8, 144 * GiB / 8, 2, 2};
  if (is({"trn1", "trainium1", "trainium", "inf2", "gen2", "v2", "neuroncore-v2", "nc2"}))
    return {"trn1", "NeuronCore-v2", 2, 32 * GiB / 2, 1, 1};
  bad(variable, text, "expected trn2 (Trainium2), trn3 (Trainium3) or trn1 (Trainium1)");
}

std::vector<int> parse_visible_cores(const std::string& text) {
  std::string s;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) s += c;
  if (s.empty()) bad("NEURON_RT_VISIBLE_CORES", text, "no cores listed");
  std::vector<int> cores;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t dash = item.find('-');
    if (dash == std::string::npos) {
      cores.push_back(parse_core(text, item));
    } else {
      int lo = parse_core(text, item.substr(0, dash));
      int hi = parse_core(text, item.substr(dash + 1));
      if (hi < lo) bad("NEURON_RT_VISIBLE_CORES", text, "range '" + item + "' is descending");
      for (int c = lo; c <= hi; ++c) cores.push_back(c);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  auto sorted = cores;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    bad("NEURON_RT_VISIBLE_CORES", text, "a core is listed twice");
  if (cores.size() > static_cast<size_t>(kMaxDevices))
    bad("NEURON_RT_VISIBLE_CORES", text,
        std::to_string(cores.size()) + " cores listed, at most " + std::to_string(kMaxDevices) + " are supported");
  return cores;
}

size_t parse_bytes(const char* variable, const std::string& text) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  const bool letters_follow = std::all_of(text.begin() + static_cast<std::ptrdiff_t>(i), text.end(),
                                          [](char c) { return std::isalpha(static_cast<unsigned char>(c)); });
  if (i == 0 || i > 15 || !letters_follow)
    bad(variable, text, "expected a whole byte count such as 4G, 512M or 1048576");
  size_t value = std::stoull(text.substr(0, i));
  std::string unit = text.substr(i);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit == "B") unit = "";
  if (!unit.empty() && unit.back() == 'B') unit.pop_back();
  if (!unit.empty() && unit.back() == 'I') unit.pop_back();  // GiB == G
  size_t scale = unit.empty() ? 1 : unit == "K" ? 1ull << 10 : unit == "M" ? 1ull << 20
               : unit == "G" ? 1ull << 30 : unit == "T" ? 1ull << 40 : 0;
  if (scale == 0) bad(variable, text, "unknown unit '" + text.substr(i) + "'");
  if (value == 0) bad(variable, text, "must be positive");
  if (value > std::numeric_limits<size_t>::max() / scale) bad(variable, text, "too large");
  return value * scale;
}

size_t parse_hbm_bytes(const std::string& text, size_t cores, size_t host_bytes) {
  const size_t per_core = parse_bytes("TORCHNEURON_HBM_BYTES", text);
  // Device memory is host memory: more than the host has would end in the
  // kernel's OOM killer, not an out-of-memory error.
  if (cores > 0 && per_core > host_bytes / cores)
    bad("TORCHNEURON_HBM_BYTES", text,
        std::to_string(cores) + " core(s) of " + gib(per_core) + " each exceed the host's " + gib(host_bytes) +
            " of memory (device memory is host memory)");
  return per_core;
}

bool parse_flag(const char* variable, const std::string& text) {
  std::string t;
  for (char c : text) t += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (t == "1" || t == "true") return true;
  if (t.empty() || t == "0" || t == "false") return false;
  bad(variable, text, "expected 1 or true (on), 0 or false (off)");
}

int parse_lnc(const char* variable, const std::string& text, const Machine& machine) {
  if (text != "1" && text != "2")
    bad(variable, text, "expected 1 or 2 (physical NeuronCores per logical NeuronCore)");
  const int lnc = text[0] - '0';
  if (lnc > machine.max_lnc)
    bad(variable, text, machine.key + " (" + machine.core_name + ") supports only " + std::to_string(machine.max_lnc) +
                            " physical NeuronCore per logical NeuronCore (TORCHNEURON_MACHINE)");
  return lnc;
}

int resolve_lnc(const char* lnc, const char* virtual_core_size, const Machine& machine) {
  const bool has_lnc = lnc && *lnc, has_size = virtual_core_size && *virtual_core_size;
  const int a = has_lnc ? parse_lnc("NEURON_LOGICAL_NC_CONFIG", lnc, machine) : 0;
  const int b = has_size ? parse_lnc("NEURON_RT_VIRTUAL_CORE_SIZE", virtual_core_size, machine) : 0;
  if (has_lnc && has_size && a != b)
    bad("NEURON_RT_VIRTUAL_CORE_SIZE", virtual_core_size,
        std::string("it contradicts NEURON_LOGICAL_NC_CONFIG='") + lnc +
            "'; both set the logical NeuronCore size: set one of them, or both alike");
  return has_lnc ? a : has_size ? b : machine.default_lnc;
}

int parse_num_cores(const std::string& text, int lnc) {
  if (text.empty() || text.size() > 6 || !std::all_of(text.begin(), text.end(), ::isdigit))
    bad("NEURON_RT_NUM_CORES", text, "expected a whole number of logical NeuronCores, such as 4 (0: the default set)");
  const int n = std::stoi(text);
  const int available = kInstanceCores / lnc;
  if (n > available)
    bad("NEURON_RT_NUM_CORES", text,
        std::to_string(n) + " cores requested, the emulated instance has " + std::to_string(available) +
            " logical NeuronCores at NEURON_LOGICAL_NC_CONFIG=" + std::to_string(lnc));
  if (n > kMaxDevices)
    bad("NEURON_RT_NUM_CORES", text,
        std::to_string(n) + " cores requested, at most " + std::to_string(kMaxDevices) + " are supported");
  return n;
}

void check_visible_cores(const std::string& text, const std::vector<int>& cores, int lnc) {
  const int available = kInstanceCores / lnc;
  for (int id : cores)
    if (id >= available)
      bad("NEURON_RT_VISIBLE_CORES", text,
          "core id " + std::to_string(id) + " is above " + std::to_string(available - 1) +
              ", the last logical NeuronCore of the emulated instance at NEURON_LOGICAL_NC_CONFIG=" +
              std::to_string(lnc));
}

double parse_seconds(const char* variable, const std::string& text) {
  char* end = nullptr;
  const double seconds = text.empty() ? -1 : std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || std::isspace(static_cast<unsigned char>(text[0])) || !(seconds >= 0))
    bad(variable, text, "expected seconds, a number >= 0 such as 60 or 0.5");
  return seconds;
}

Config config_from_environment() {
  Config c;
  const char* machine = std::getenv("TORCHNEURON_MACHINE");
  c.machine = parse_machine(machine && *machine ? machine : "trn2");
  // The NKI emulator's own name for the machine model (torchneuron/nki/machine.py):
  // a bad one is refused here too, at start-up, not at the first kernel launch.
  if (const char* target = std::getenv("TORCHNEURON_NKI_TARGET"); target && *target)
    parse_machine(target, "TORCHNEURON_NKI_TARGET");
  c.lnc = resolve_lnc(std::getenv("NEURON_LOGICAL_NC_CONFIG"), std::getenv("NEURON_RT_VIRTUAL_CORE_SIZE"), c.machine);
  // Checked even when NEURON_RT_VISIBLE_CORES wins, so that a typo is never silent.
  if (const char* num = std::getenv("NEURON_RT_NUM_CORES"); num && *num) c.num_cores = parse_num_cores(num, c.lnc);
  if (const char* cores = std::getenv("NEURON_RT_VISIBLE_CORES")) {
    c.visible_cores = parse_visible_cores(cores);
    check_visible_cores(cores, c.visible_cores, c.lnc);
  } else if (c.num_cores > 0) {
    // The runtime picks free cores; an emulated instance has no other owners.
    for (int i = 0; i < c.num_cores; ++i) c.visible_cores.push_back(i);
  } else {
    // Two, not the instance's all: multi-device code is exercised, and each
    // core's memory is a share of the host's.
    c.visible_cores = {0, 1};
  }
  const char* hbm = std::getenv("TORCHNEURON_HBM_BYTES");
  const size_t host_bytes = static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGE_SIZE));
  const size_t host_share = host_bytes / 2 / c.visible_cores.size();
  c.hbm_bytes = hbm && *hbm ? parse_hbm_bytes(hbm, c.visible_cores.size(), host_bytes)
                            : std::min(c.machine.hbm_bytes_per_core * static_cast<size_t>(c.lnc), host_share);
  // Read by the exit drain (torchneuron/_registration.py); checked here, with the others.
  if (const char* timeout = std::getenv("TORCHNEURON_EXIT_TIMEOUT"); timeout && *timeout)
    parse_seconds("TORCHNEURON_EXIT_TIMEOUT", timeout);
  const char* blocking = std::getenv("NEURON_LAUNCH_BLOCKING");
  c.launch_blocking = parse_flag("NEURON_LAUNCH_BLOCKING", blocking ? blocking : "");
  return c;
}

} // namespace torchneuron::runtime
