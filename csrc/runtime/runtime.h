// The emulated NeuronCore runtime: devices, memory, streams, events, tasks.
// No PyTorch here; the bridge (csrc/bridge) is the only client.
#pragma once

#include "config.h"
#include "device.h"
#include "errors.h"
#include "event.h"
#include "stream.h"
#include "task.h"
