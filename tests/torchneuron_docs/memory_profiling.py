"""Memory statistics and a snapshot, as TorchNeuron's memory-profiling guide reads them: synchronize,
then memory_allocated / max_memory_allocated / memory_reserved / memory_stats, a recorded allocation
history dumped as a snapshot PyTorch's memory visualizer opens."""
import os
import pickle
import sys
import tempfile

import torch
import torch_neuronx

torch.neuron.memory._record_memory_history(max_entries=10000)
torch_neuronx.reset_peak_memory_stats()
base = torch_neuronx.memory_allocated()
x = torch.randn(1024, 1024, device="neuron")  # 4 MiB
y = x @ x
del x
torch_neuronx.synchronize()  # frees are stream-ordered: read the statistics after the device is idle
allocated, peak, reserved = (torch_neuronx.memory_allocated(), torch_neuronx.max_memory_allocated(),
                             torch_neuronx.memory_reserved())
stats = torch_neuronx.memory_stats()
print(f"allocated {allocated >> 20} MiB, peak {peak >> 20} MiB, reserved {reserved >> 20} MiB")
assert allocated - base == 4 << 20 and peak - base >= 8 << 20 and reserved >= allocated
assert stats["allocated_bytes.all.current"] == allocated
path = os.path.join(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(), "snapshot.pickle")
torch.neuron.memory._dump_snapshot(path)
torch.neuron.memory._record_memory_history(enabled=None)
with open(path, "rb") as f:
    snapshot = pickle.load(f)
assert snapshot["segments"] and snapshot["device_traces"], "segments and the allocation history"
print(torch_neuronx.memory_summary().splitlines()[0])
del y
torch_neuronx.empty_cache()
print("OK memory profiling")
