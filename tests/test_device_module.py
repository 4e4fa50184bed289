"""torch.neuron and torch.accelerator as users meet them: names, counts and
properties, generated methods, autoload, fork, printing, and bad input
(mixed devices, invalid indices, invalid NEURON_RT_VISIBLE_CORES)."""
import pytest
import torch

from neuron_testing import run_python


def test_device_module_basics():
    assert torch.neuron.is_available()
    assert torch.neuron.device_count() == 2  # default NEURON_RT_VISIBLE_CORES
    props = torch.neuron.get_device_properties(0)
    assert props.name == torch.neuron.get_device_name(0) == "NeuronCore-v3 (emulated)"
    assert props.total_memory == 4 << 30
    torch.neuron.init()
    assert torch.neuron.is_initialized()


def test_torch_accelerator_sees_neuron():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("neuron")
    assert torch.accelerator.device_count() == 2
    s = torch.accelerator.current_stream()
    assert s.device == torch.device("neuron:0")
    x = torch.ones(4, device="neuron") * 3
    torch.accelerator.synchronize()
    assert x.sum().item() == 12


def test_generated_methods():
    t = torch.ones(3)
    n = t.neuron()
    assert n.is_neuron and n.device.type == "neuron"
    m = torch.nn.Linear(2, 2).neuron()
    assert next(m.parameters()).is_neuron
    assert t.to("neuron:1").device.index == 1
    assert n.untyped_storage().is_neuron


def test_mixed_devices_raise_like_pytorch():
    a = torch.ones(3, device="neuron")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.ones(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.ones(3, device="neuron:1")
    # CPU scalars mix freely, as with CUDA
    assert (a + torch.tensor(2.0)).cpu().tolist() == [3.0, 3.0, 3.0]


def test_invalid_device_index():
    with pytest.raises((RuntimeError, IndexError), match="invalid neuron device index 7"):
        torch.zeros(1, device="neuron:7")
    with pytest.raises((RuntimeError, IndexError)):
        torch.neuron.set_device(9)


def test_invalid_visible_cores_is_a_clear_error():
    r = run_python(
        """
        import torch
        print("available", torch.neuron.is_available())
        torch.zeros(1, device="neuron")
        """,
        env={"NEURON_RT_VISIBLE_CORES": "3-1"},
    )
    assert "available False" in r.stdout
    assert r.returncode != 0
    assert "NEURON_RT_VISIBLE_CORES='3-1' is invalid" in r.stderr


def test_visible_cores_sets_the_count():
    r = run_python("import torch; print(torch.neuron.device_count())", env={"NEURON_RT_VISIBLE_CORES": "0,2,5"})
    assert r.stdout.strip() == "3", r.stderr


def test_autoload_and_opt_out():
    r = run_python("import torch; print((torch.ones(2, device='neuron') + 1).cpu().tolist())")
    assert r.stdout.strip() == "[2.0, 2.0]", r.stderr
    r = run_python("import torch; print(hasattr(torch, 'neuron'))", env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.stdout.strip() == "False", r.stderr


def test_fork_after_init_raises_and_recommends_spawn():
    r = run_python(
        """
        import os, torch
        x = torch.ones(2, device="neuron") + 1
        torch.neuron.synchronize()
        pid = os.fork()
        if pid == 0:
            try:
                torch.ones(2, device="neuron") + 1
                os._exit(3)
            except RuntimeError as e:
                print("child:", e, flush=True)
                os._exit(0 if "spawn" in str(e) else 4)
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status))
        """
    )
    assert "child exit 0" in r.stdout, r.stdout + r.stderr
    assert "forked subprocess" in r.stdout


def test_printing_and_assert_close():
    x = torch.arange(4.0, device="neuron")
    assert "device='neuron:0'" in repr(x)
    torch.testing.assert_close(x * 2, torch.arange(0.0, 8.0, 2.0, device="neuron"))
    with pytest.raises(AssertionError):
        torch.testing.assert_close(x, x + 1)

