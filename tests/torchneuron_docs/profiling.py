"""Profiling as TorchNeuron's profiling guide does it: torch.profiler with CPU and PrivateUse1 activities,
a NeuronConfig as experimental_config, NeuronProfiler's export_trace as on_trace_ready, warm-up first,
synchronize inside the profiled region. The files land in <dir>/<host>_pid_<pid>/<timestamp>/."""
import glob
import json
import os
import sys
import tempfile

import torch
import torch_neuronx
from torch.profiler import ProfilerActivity, profile, record_function
from torch_neuronx.profiling import NeuronConfig, NeuronProfiler, ProfileMode

out_dir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)).to("neuron")
x = torch.randn(64, 256, device="neuron")
for _ in range(3):  # warm-up: first calls are not what is measured
    model(x)
torch_neuronx.synchronize()

config = NeuronConfig(modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME], profile_output_dir=out_dir)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], experimental_config=config,
             on_trace_ready=NeuronProfiler(config).export_trace, record_shapes=True) as prof:
    with record_function("train_step"):
        for _ in range(2):
            model(x).sum()
    torch_neuronx.synchronize()

traces = glob.glob(os.path.join(out_dir, f"*_pid_{os.getpid()}", "*", "trace.json"))
assert len(traces) == 1, traces
with open(traces[0]) as f:
    events = json.load(f)["traceEvents"]
names = {e.get("name") for e in events}
assert "train_step" in names and any("addmm" in str(n) for n in names)
assert any(e.get("cat") == "kernel" or "neuron" in str(e.get("cat", "")).lower() for e in events), "device rows"
print("trace:", os.path.relpath(traces[0], out_dir))
print("OK profiling")
