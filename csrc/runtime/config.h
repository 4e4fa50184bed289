// Runtime configuration from the environment, parsed once, at the first
// device use; a bad value of any of these is a ConfigError naming it.
//   NEURON_RT_VISIBLE_CORES  which cores exist: "0-3", "0,2", "1" (default "0-1");
//                            ids 0-127, at most kMaxDevices of them
//   TORCHNEURON_MACHINE      the machine model: trn2 (Trainium2, NeuronCore-v3;
//                            the default), trn3 (Trainium3, NeuronCore-v4), trn1
//                            (Trainium1, NeuronCore-v2), or another name of one
//                            (trainium3, v4, gen4, neuroncore-v4, nc4); the NKI
//                            emulator reads the same variable
//                            (torchneuron/nki/machine.py)
//   TORCHNEURON_NKI_TARGET   the NKI emulator's second name for the setting;
//                            only checked here
//   TORCHNEURON_HBM_BYTES    device memory per core: bytes or with K/M/G/T suffix,
//                            all cores together within the host's memory
//                            (default: the machine's HBM per core, or the core's
//                            share of half the host's memory if that is less:
//                            device memory is host memory)
//   NEURON_LAUNCH_BLOCKING   1: every launch runs before it returns; 0 or unset: not
//   TORCHNEURON_EXIT_TIMEOUT seconds the exit drain waits (torchneuron/_registration.py);
//                            only checked here
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace torchneuron::runtime {

// The most devices a process can see (the bridge keeps per-device state in
// arrays of this size).
constexpr int kMaxDevices = 64;

// What the runtime reports of a machine model (DeviceProperties).
struct Machine {
  std::string key;            // "trn2"
  std::string core_name;      // "NeuronCore-v3"
  int cores_per_device = 0;
  size_t hbm_bytes_per_core = 0;
};

struct Config {
  Machine machine;
  std::vector<int> visible_cores;  // physical core ids, in logical order
  size_t hbm_bytes = 0;
  bool launch_blocking = false;
};

// Parsers, exposed for tests. They throw ConfigError naming the variable.
std::vector<int> parse_visible_cores(const std::string& text);
size_t parse_bytes(const char* variable, const std::string& text);
// TORCHNEURON_HBM_BYTES for `cores` cores on a host with `host_bytes` of memory.
size_t parse_hbm_bytes(const std::string& text, size_t cores, size_t host_bytes);
// NEURON_LAUNCH_BLOCKING and other on/off settings: "1", "0" or "".
bool parse_flag(const char* variable, const std::string& text);
// A duration in seconds: a number >= 0 ("60", "0.5", "inf").
double parse_seconds(const char* variable, const std::string& text);
Machine parse_machine(const std::string& text, const char* variable = "TORCHNEURON_MACHINE");

// Reads the environment; throws ConfigError if a variable is invalid.
Config config_from_environment();

} // namespace torchneuron::runtime
