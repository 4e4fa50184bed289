"""``torch_neuronx``'s native API, as AWS's TorchNeuron documents it, on this device: every name a
TorchNeuron program calls on the module exists and answers as there (torch_neuronx/_native.py).
The XLA-era functions are tested in hf/test_integration.py."""
import pytest
import torch

import torch_neuronx
import torchneuron

NATIVE = ["synchronize", "device_count", "current_device", "set_device", "get_device_properties",
          "is_neuron_runtime_initialized", "device", "Stream", "Event", "StreamContext", "stream", "current_stream",
          "default_stream", "set_stream", "memory_stats", "memory_allocated", "max_memory_allocated",
          "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
          "memory_summary", "empty_cache", "get_fallback_ops", "get_executed_ops", "clear_op_tracking", "nki_op",
          "wrap_nki", "get_dynamo_metrics", "reset_dynamo_metrics", "neuron_dynamo_backend", "profiling",
          "NeuronProfiler"]
BACKEND = ["neuron_backend", "create_neuron_backend", "set_model_name", "get_model_name", "NeuronCompileError",
           "NeuronCompilationMetrics"]
PROFILING = ["NeuronConfig", "ProfileMode", "NeuronProfiler"]


@pytest.mark.parametrize("name", NATIVE)
def test_every_native_name_exists(name):
    assert hasattr(torch_neuronx, name) and name in torch_neuronx.__all__


def test_compilation_metrics_are_also_torch_neurons():
    assert torch.neuron.get_dynamo_metrics is torch_neuronx.get_dynamo_metrics
    assert torch.neuron.reset_dynamo_metrics is torch_neuronx.reset_dynamo_metrics


def test_every_name_of_the_submodules_exists():
    assert [n for n in BACKEND if not hasattr(torch_neuronx.neuron_dynamo_backend, n)] == []
    assert [n for n in PROFILING if not hasattr(torch_neuronx.profiling, n)] == []


def test_docs_table_answers_every_public_name():
    """docs/torchneuron.md says how this device answers each name torch_neuronx exports."""
    import pathlib

    text = (pathlib.Path(__file__).parents[1] / "docs" / "torchneuron.md").read_text()
    missing = [n for n in (*torch_neuronx.__all__, *BACKEND, *PROFILING)
               if n != "__version__" and f"`{n}" not in text and f"{n}(" not in text and f".{n}" not in text]
    assert missing == []


def test_device_stream_and_memory_functions_are_the_devices():
    assert torch_neuronx.device_count() == torch.neuron.device_count()
    assert torch_neuronx.is_neuron_runtime_initialized()
    s = torch_neuronx.Stream()
    with torch_neuronx.stream(s):
        assert torch_neuronx.current_stream() == s
        x = torch.ones(1 << 16, device="neuron") * 2
    torch_neuronx.synchronize()
    assert torch_neuronx.memory_allocated() == torch.neuron.memory_allocated() >= x.nbytes
    torch_neuronx.reset_peak_memory_stats()
    assert torch_neuronx.max_memory_allocated() == torch_neuronx.memory_allocated()
    assert torch_neuronx.memory_stats()["allocated_bytes.all.current"] == torch_neuronx.memory_allocated()
    e = torch_neuronx.Event(enable_timing=True)
    e.record()
    e.synchronize()
    assert e.query()


def test_set_device_refuses_a_bad_index_with_value_error():
    before = torch_neuronx.current_device()
    with pytest.raises(ValueError, match="Invalid device id: 99"):
        torch_neuronx.set_device(99)
    with pytest.raises(ValueError, match="Invalid device id: -1"):
        torch_neuronx.set_device(-1)
    assert torch_neuronx.current_device() == before
    torch_neuronx.set_device("neuron:1")
    try:
        assert torch_neuronx.current_device() == 1
    finally:
        torch_neuronx.set_device(before)


def test_op_tracking_lists_a_name_per_call():
    torch_neuronx.clear_op_tracking()
    x = torch.ones(4096, device="neuron")
    (x + 1).nonzero()
    (x + 2).nonzero()
    torch_neuronx.synchronize()
    executed = torch_neuronx.get_executed_ops()
    assert isinstance(executed, list) and executed.count("aten::nonzero") == 2
    assert executed.count("aten::add.Tensor") == torchneuron.get_executed_ops()["aten::add.Tensor"] == 2
    assert torch_neuronx.get_fallback_ops() == []
    torch_neuronx.clear_op_tracking()
    assert torch_neuronx.get_executed_ops() == []


def test_wrap_nki_launches_a_kernel_with_its_grid():
    from torchneuron import nki
    import torchneuron.nki.language as nl

    @nki.jit
    def add_one(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a) + 1)
        return out

    a = torch.arange(8.0, device="neuron").reshape(1, 8)
    caller = torch_neuronx.wrap_nki(add_one)
    assert torch.equal(caller(a).cpu(), a.cpu() + 1)
    assert torch.equal(caller[1](a).cpu(), a.cpu() + 1)
    with pytest.raises(TypeError, match="@nki.jit kernel"):
        torch_neuronx.wrap_nki(lambda a: a)
