// Runtime configuration from the environment, parsed once, at the first
// device use; a bad value of any of these is a ConfigError naming it.
// torchneuron/environment.py lists every variable the project knows, these
// included (docs/environment.md).
//   NEURON_LOGICAL_NC_CONFIG physical NeuronCores per logical core (LNC), 1 or 2;
//                            default the machine's: 2 on trn2 and trn3, 1 on trn1
//                            (which has no LNC=2). A device is a logical core:
//                            its memory is LNC times a physical core's HBM
//   NEURON_RT_VIRTUAL_CORE_SIZE the runtime's older name for the same size; both
//                            set and different is an error
//   NEURON_RT_VISIBLE_CORES  which logical cores the process claims: "0-3", "0,2",
//                            "1" (default "0-1"); ids below kInstanceCores / LNC,
//                            at most kMaxDevices of them
//   NEURON_RT_NUM_CORES      how many logical cores the process claims (the first
//                            ones); 0 or unset: the default set. As on the Neuron
//                            runtime, NEURON_RT_VISIBLE_CORES takes precedence
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
// Physical NeuronCores of the emulated instance, whatever the machine model: a
// trn2.48xlarge's 16 devices of 8. Core ids name logical cores, so at LNC=2 the
// instance has half as many.
constexpr int kInstanceCores = 128;

// What the runtime reports of a machine model (DeviceProperties).
struct Machine {
  std::string key;            // "trn2"
  std::string core_name;      // "NeuronCore-v3"
  int cores_per_device = 0;        // physical
  size_t hbm_bytes_per_core = 0;   // per physical core
  int default_lnc = 1;             // the LNC the machine runs when none is set
  int max_lnc = 1;                 // trn1 has no LNC=2
};

struct Config {
  Machine machine;
  int lnc = 1;                     // physical cores per logical core (per device)
  std::vector<int> visible_cores;  // logical core ids, in device order
  int num_cores = 0;               // NEURON_RT_NUM_CORES as read; 0 when unset
  size_t hbm_bytes = 0;            // device memory per logical core
  bool launch_blocking = false;
};

// Parsers, exposed for tests. They throw ConfigError naming the variable.
std::vector<int> parse_visible_cores(const std::string& text);
size_t parse_bytes(const char* variable, const std::string& text);
// TORCHNEURON_HBM_BYTES for `cores` cores on a host with `host_bytes` of memory.
size_t parse_hbm_bytes(const std::string& text, size_t cores, size_t host_bytes);
// NEURON_LAUNCH_BLOCKING and other on/off settings: "1"/"true", "0"/"false" (any
// case, as the Neuron runtime reads its booleans) or "".
bool parse_flag(const char* variable, const std::string& text);
// NEURON_LOGICAL_NC_CONFIG or NEURON_RT_VIRTUAL_CORE_SIZE: 1 or 2, within what
// the machine supports.
int parse_lnc(const char* variable, const std::string& text, const Machine& machine);
// The LNC from both names (nullptr or "" when unset): the machine's default,
// or the one set, or both alike.
int resolve_lnc(const char* lnc, const char* virtual_core_size, const Machine& machine);
// NEURON_RT_NUM_CORES: a whole number, 0 (unset: the default set) up to the
// logical cores of the instance at `lnc`, at most kMaxDevices.
int parse_num_cores(const std::string& text, int lnc);
// NEURON_RT_VISIBLE_CORES checked against the instance's logical cores at `lnc`.
void check_visible_cores(const std::string& text, const std::vector<int>& cores, int lnc);
// A duration in seconds: a number >= 0 ("60", "0.5", "inf").
double parse_seconds(const char* variable, const std::string& text);
Machine parse_machine(const std::string& text, const char* variable = "TORCHNEURON_MACHINE");

// Reads the environment; throws ConfigError if a variable is invalid.
Config config_from_environment();

} // namespace torchneuron::runtime
