// Runtime configuration from the environment, parsed once.
//   NEURON_RT_VISIBLE_CORES  which cores exist: "0-3", "0,2", "1" (default "0-1")
//   TORCHNEURON_HBM_BYTES    device memory per core: bytes or with K/M/G suffix
//                            (default 4G)
//   NEURON_LAUNCH_BLOCKING   1: every launch runs before it returns
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace torchneuron::runtime {

struct Config {
  std::vector<int> visible_cores;  // physical core ids, in logical order
  size_t hbm_bytes = 0;
  bool launch_blocking = false;
};

// Parsers, exposed for tests. They throw ConfigError naming the variable.
std::vector<int> parse_visible_cores(const std::string& text);
size_t parse_bytes(const char* variable, const std::string& text);

// Reads the environment; throws ConfigError if a variable is invalid.
Config config_from_environment();

} // namespace torchneuron::runtime
