"""torch.neuron and torch.accelerator as users meet them: names, counts and
properties, generated methods, autoload, fork (the child's clear error and
its own exit status, os.fork and multiprocessing), printing, and bad input
(mixed devices, invalid indices, every start-up setting refused naming the
variable); the machine model's device properties; the functions torch.neuron
mirrors from torch.cuda, with its signatures and its exception types
(capability, StreamContext)."""
import inspect
import os
import time
import warnings

import pytest
import torch

from neuron_testing import run_python


def test_device_module_basics():
    assert torch.neuron.is_available()
    assert torch.neuron.device_count() == 2  # default NEURON_RT_VISIBLE_CORES
    props = torch.neuron.get_device_properties(0)
    assert props.name == torch.neuron.get_device_name(0) == "NeuronCore-v3 (emulated)"  # Trainium2, the default
    # Trainium2 runs LNC=2 by default: a device is a logical core of 2 physical ones, 4 per Trainium2 device
    assert props.cores_per_device == 4 and props.logical_nc_config == 2
    # Trainium2's 96 GiB of HBM over 8 physical cores, 2 of them per device, unless a core's share of half
    # the host's memory is less
    host_share = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2 // torch.neuron.device_count()
    assert props.total_memory == min(24 << 30, host_share)
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


STORAGE_DTYPES = [d for d in torch.storage._dtype_to_storage_type_map() if d.is_floating_point or d.is_complex
                  or d in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)]


@pytest.mark.parametrize("dtype", STORAGE_DTYPES, ids=str)
def test_storage_type_is_the_device_modules_as_on_cuda(dtype):
    """Tensor.storage_type(): the CPU's class is torch.<Name>Storage, CUDA's torch.cuda.<Name>Storage,
    neuron's torch.neuron.<Name>Storage, the same legacy class of the device."""
    name = torch.storage._dtype_to_storage_type_map()[dtype]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
        cpu = torch.zeros(3, dtype=dtype)
        neuron = cpu.to("neuron")
        cls = neuron.storage_type()
        assert cpu.storage_type() is getattr(torch, name)
        assert cls is getattr(torch.neuron, name) and cls.__name__ == name and cls.__module__ == "torch.neuron"
        assert cls.dtype == dtype == getattr(torch, name).dtype
        assert isinstance(neuron.storage(), cls) and not isinstance(cpu.storage(), cls)
        assert not isinstance(neuron.storage(), getattr(torch, name))
        assert neuron.storage().type() == f"torch.neuron.{name}"
        made = cls(4)
        assert (made.device.type, made.dtype, made.size()) == ("neuron", dtype, 4)
        wrapped = cls(wrap_storage=neuron.untyped_storage())
        assert wrapped.device == neuron.device and wrapped.data_ptr() == neuron.data_ptr()
        # A storage of the other device is refused, as by the CPU's class.
        for klass, other in ((cls, cpu), (getattr(torch, name), neuron)):
            with pytest.raises(RuntimeError, match="Device of 'wrap_storage' must be"):
                klass(wrap_storage=other.untyped_storage())
        with pytest.raises(RuntimeError, match="host buffer"):
            cls.from_buffer(b"\0" * 16)


def test_storage_classes_from_values_and_serialization(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        s = torch.neuron.FloatStorage([1, 2, 3])
        assert s.device.type == "neuron" and s.tolist() == torch.FloatStorage([1, 2, 3]).tolist()
        t = torch.arange(5.0, device="neuron")
        torch.save(t, tmp_path / "t.pt")
        back = torch.load(tmp_path / "t.pt")
        assert back.device == t.device and back.storage_type() is torch.neuron.FloatStorage
        assert torch.equal(back.cpu(), t.cpu())


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


HOST_GIB = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / (1 << 30)

# Each setting the runtime reads at start-up, with values it refuses and the reason it gives.
BAD_SETTINGS = [
    ("TORCHNEURON_HBM_BYTES", "1T", f"2 core(s) of 1024.0 GiB each exceed the host's {HOST_GIB:.1f} GiB of memory"),
    ("TORCHNEURON_HBM_BYTES", f"{int(HOST_GIB) // 2 + 1}G", "exceed the host's"),
    ("TORCHNEURON_HBM_BYTES", "4.5G", "expected a whole byte count"),
    ("TORCHNEURON_HBM_BYTES", "-1", "expected a whole byte count"),
    ("TORCHNEURON_HBM_BYTES", "12X", "unknown unit 'X'"),
    ("TORCHNEURON_HBM_BYTES", "0", "must be positive"),
    ("TORCHNEURON_HBM_BYTES", "99999999999999T", "too large"),
    ("TORCHNEURON_MACHINE", "gpu", "expected trn2"),
    ("TORCHNEURON_NKI_TARGET", "v9", "expected trn2"),
    ("NEURON_RT_VISIBLE_CORES", "0-64", "65 cores listed, at most 64 are supported"),
    ("NEURON_RT_VISIBLE_CORES", "200", "core id 200 is above 127"),
    ("NEURON_RT_VISIBLE_CORES", "two", "expected core ids"),
    ("NEURON_LAUNCH_BLOCKING", "yes", "expected 1 or true (on), 0 or false (off)"),
    ("TORCHNEURON_EXIT_TIMEOUT", "soon", "expected seconds"),
    ("TORCHNEURON_EXIT_TIMEOUT", "-1", "expected seconds"),
]


@pytest.mark.parametrize("variable, value, why", BAD_SETTINGS, ids=[f"{v}={x}" for v, x, _ in BAD_SETTINGS])
def test_a_bad_setting_is_refused_at_the_first_device_use_naming_it(variable, value, why):
    # As for NEURON_RT_VISIBLE_CORES above: no device is available, and the first use raises.
    r = run_python(
        """
        import torch
        print("available", torch.neuron.is_available(), flush=True)
        torch.zeros(1, device="neuron")
        """,
        env={variable: value},
    )
    assert "available False" in r.stdout, r.stdout + r.stderr
    assert r.returncode == 1
    assert f"RuntimeError: {variable}='{value}' is invalid: " in r.stderr and why in r.stderr, r.stderr


def test_settings_within_bounds_are_accepted():
    r = run_python("import torch; print(torch.neuron.get_device_properties(0).total_memory, "
                   "(torch.ones(2, device='neuron:3') + 1).cpu().tolist())",
                   env={"TORCHNEURON_HBM_BYTES": f"{int(HOST_GIB * 1024) // 4}M", "NEURON_RT_VISIBLE_CORES": "0-3",
                        "NEURON_LAUNCH_BLOCKING": "0", "TORCHNEURON_NKI_TARGET": "trn3"})
    assert r.stdout.split() == [str((int(HOST_GIB * 1024) // 4) << 20), "[2.0,", "2.0]"], r.stderr


def test_visible_cores_sets_the_count():
    r = run_python("import torch; print(torch.neuron.device_count())", env={"NEURON_RT_VISIBLE_CORES": "0,2,5"})
    assert r.stdout.strip() == "3", r.stderr


def test_autoload_and_opt_out():
    r = run_python("import torch; print((torch.ones(2, device='neuron') + 1).cpu().tolist())")
    assert r.stdout.strip() == "[2.0, 2.0]", r.stderr
    r = run_python("import torch; print(hasattr(torch, 'neuron'))", env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.stdout.strip() == "False", r.stderr


# A parent that has used `DEVICE` (a module name: "neuron" or "cpu") and
# holds tensors, a module with an optimizer that has stepped, and, on neuron,
# a side stream, an event and pinned memory; then forks children that end in
# each way a program ends. Prints each child's exit status by ending.
FORK_PARENT = """
    import gc, os, sys, time, torch
    device = DEVICE
    x = torch.ones(1 << 16, device=device) * 2
    y = x[::2]
    model = torch.nn.Linear(8, 4).to(device)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 8, device=device)).sum().backward()
    opt.step()
    if device == "neuron":
        side = torch.neuron.Stream()
        with torch.neuron.stream(side):
            z = x + 1
        ev = torch.neuron.Event()
        ev.record(side)
        pinned = torch.arange(1 << 10, dtype=torch.float32).pin_memory()
        queued = [x * 3 for _ in range(8)]  # work possibly still queued at the fork
    ENDINGS = {
        "del then sys.exit(5)": "del x, y, model, opt; gc.collect(); sys.exit(5)",
        "sys.exit(5)": "sys.exit(5)",
        "os._exit(4)": "os._exit(4)",
        "end of program": "pass",
        "uncaught exception": "raise ValueError('child')",
        "drop everything, end": "x = y = model = opt = side = z = ev = pinned = queued = None; gc.collect()",
    }
    for name, ending in ENDINGS.items():
        sys.stdout.flush()
        sys.stderr.flush()
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            exec(ending)
            sys.exit(0)  # the endings that do not exit reach this: the program ends
        _, status = os.waitpid(pid, 0)
        print(name, "->", os.waitstatus_to_exitcode(status), flush=True)
        print("seconds", time.monotonic() - start, flush=True)
"""


def _statuses(program, device):
    """The children's exit statuses, the longest a child took, and stderr."""
    r = run_python(program.replace("DEVICE", repr(device)))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    return ([line for line in lines if "->" in line],
            max(float(line.split()[1]) for line in lines if line.startswith("seconds")), r.stderr)


def test_a_forked_child_exits_with_its_own_status_whatever_it_inherited():
    """Whatever a child inherits from a parent that used the device, and
    whether it drops it or not, it ends with the status it chose, as a child
    of a CPU program does (CUDA's children too): frees of the parent's device
    memory in the child are no-ops, and there is no exit drain to run. Nor
    does its exit wait for autograd threads it inherited the count of but
    not the threads (torchneuron/_registration.py)."""
    neuron, neuron_seconds, neuron_err = _statuses(FORK_PARENT, "neuron")
    cpu, cpu_seconds, _ = _statuses(FORK_PARENT, "cpu")
    assert neuron == cpu, neuron_err
    # Not the autograd engine's 10 s wait for device threads the child does not have
    assert max(neuron_seconds, cpu_seconds) < 8, (neuron_seconds, cpu_seconds)
    assert cpu == ["del then sys.exit(5) -> 5", "sys.exit(5) -> 5", "os._exit(4) -> 4", "end of program -> 0",
                   "uncaught exception -> 1", "drop everything, end -> 0"]
    assert "terminate called" not in neuron_err and "forked subprocess" not in neuron_err, neuron_err


def test_a_forked_child_that_uses_the_device_gets_the_clear_error_then_exits_with_its_own_status():
    r = run_python(
        """
        import os, sys, torch
        x = torch.ones(2, device="neuron") + 1
        torch.neuron.synchronize()
        uses = {"a new tensor": lambda: torch.ones(2, device="neuron"), "the inherited one": lambda: x.cpu(),
                "x + 1": lambda: x + 1, "init": torch.neuron.init, "synchronize": torch.neuron.synchronize,
                "pin_memory": lambda: torch.ones(4).pin_memory()}
        for name, use in uses.items():
            pid = os.fork()
            if pid == 0:
                print(name, "initialised", torch.neuron.is_initialized(), flush=True)
                try:
                    use()
                    print(name, "no error", flush=True)
                except RuntimeError as e:
                    print(name, "error:", e, flush=True)
                sys.exit(7)
            _, status = os.waitpid(pid, 0)
            print(name, "->", os.waitstatus_to_exitcode(status), flush=True)
        pid = os.fork()
        if pid == 0:
            x + 1  # uncaught: the child ends as a Python program with an uncaught exception does
        _, status = os.waitpid(pid, 0)
        print("uncaught ->", os.waitstatus_to_exitcode(status), flush=True)
        print("parent", (x * 2).cpu().tolist(), torch.neuron.is_initialized())
        """
    )
    assert r.returncode == 0, r.stderr
    for name in ("a new tensor", "the inherited one", "x + 1", "init", "synchronize", "pin_memory"):
        assert f"{name} initialised False" in r.stdout
        assert (f"{name} error: the neuron device cannot be used in a forked subprocess after the parent "
                "process initialised it; use the 'spawn' start method") in r.stdout, r.stdout
        assert f"{name} -> 7" in r.stdout, r.stdout + r.stderr
    assert "uncaught -> 1" in r.stdout and "use the 'spawn' start method" in r.stderr
    assert "parent [4.0, 4.0] True" in r.stdout
    assert "terminate called" not in r.stderr


def test_a_child_forked_before_the_device_started_can_use_it():
    # As with CUDA: a parent that only imported torch (and counted devices) has not initialised the device.
    r = run_python(
        """
        import os, torch
        print("count", torch.neuron.device_count())
        pid = os.fork()
        if pid == 0:
            print("child", (torch.ones(2, device="neuron") + 1).cpu().tolist(), flush=True)
            raise SystemExit(3)
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status), "parent initialised", torch.neuron.is_initialized())
        """
    )
    assert "child [2.0, 2.0]" in r.stdout and "child exit 3 parent initialised False" in r.stdout, r.stdout + r.stderr


MP_FORK = """
    import multiprocessing as mp, os, sys, torch
    device = DEVICE
    x = torch.ones(4, device=device) * 2
    model = torch.nn.Linear(4, 2).to(device)

    def untouched(code):
        y = x  # the inherited tensor, dropped at return
        sys.exit(code)

    def touches():
        print("touch", (x + 1).sum().item(), flush=True)

    def square(n):
        return n * n

    def square_on_device(n):
        return (x * n).sum().item()

    if __name__ == "__main__":
        ctx = mp.get_context("fork")
        for name, target, args in [("exit 0", untouched, (0,)), ("exit 5", untouched, (5,)), ("touches", touches, ())]:
            p = ctx.Process(target=target, args=args)
            p.start()
            p.join()
            print("process", name, "->", p.exitcode, flush=True)
        with ctx.Pool(2) as pool:
            print("pool ->", pool.map(square, range(4)), flush=True)
            try:
                print("pool on device ->", pool.map(square_on_device, range(2)), flush=True)
            except RuntimeError as e:
                print("pool on device -> RuntimeError", "spawn" in str(e), flush=True)
        print("parent", (x + 1).sum().item(), flush=True)
"""


def test_multiprocessing_fork_children_exit_as_the_cpus_do():
    """The 'fork' start method: Process children end with their own status
    (a child that uses the device gets the clear error, an uncaught exception,
    status 1), Pool workers inherit tensors and work; a Pool task that uses the
    device raises the clear error in the parent."""
    def run(device):
        r = run_python(MP_FORK.replace("DEVICE", repr(device)))
        assert r.returncode == 0, r.stderr
        return r.stdout.splitlines(), r.stderr

    neuron, neuron_err = run("neuron")
    cpu, _ = run("cpu")
    assert cpu == ["process exit 0 -> 0", "process exit 5 -> 5", "touch 12.0", "process touches -> 0",
                   "pool -> [0, 1, 4, 9]", "pool on device -> [0.0, 8.0]", "parent 12.0"]
    assert neuron == ["process exit 0 -> 0", "process exit 5 -> 5", "process touches -> 1", "pool -> [0, 1, 4, 9]",
                      "pool on device -> RuntimeError True", "parent 12.0"], neuron_err
    assert "use the 'spawn' start method" in neuron_err and "terminate called" not in neuron_err, neuron_err


def test_printing_and_assert_close():
    x = torch.arange(4.0, device="neuron")
    assert "device='neuron:0'" in repr(x)
    torch.testing.assert_close(x * 2, torch.arange(0.0, 8.0, 2.0, device="neuron"))
    with pytest.raises(AssertionError):
        torch.testing.assert_close(x, x + 1)



def _parameters(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", ["get_device_capability", "get_device_properties", "StreamContext", "stream"])
def test_signature_is_torch_cuda_s(name):
    assert _parameters(getattr(torch.neuron, name)) == _parameters(getattr(torch.cuda, name))


def test_get_device_capability():
    for device in (None, 0, 1, "neuron", "neuron:1", torch.device("neuron", 1)):
        props = torch.neuron.get_device_properties(device)
        major, minor = torch.neuron.get_device_capability(device)
        assert (major, minor) == (props.major, props.minor)
        assert props.name.startswith(f"NeuronCore-v{major} ") and minor == 0  # the generation in the name
    with torch.neuron.device(1):  # None and an index-less device mean the current device
        assert torch.neuron.get_device_properties().core_id == torch.neuron.get_device_properties(1).core_id
        assert torch.neuron.get_device_properties("neuron").core_id == torch.neuron.get_device_properties(1).core_id


@pytest.mark.parametrize("fn", ["get_device_capability", "get_device_properties"])
def test_device_capability_errors_are_torch_cuda_s(fn):
    # torch.cuda.get_device_properties (which get_device_capability calls):
    # _get_device_index raises ValueError for another device type, then an
    # index outside [0, device_count()) is an AssertionError("Invalid device id").
    f = getattr(torch.neuron, fn)
    for bad in ("cpu", torch.device("cpu"), "cuda:0"):
        with pytest.raises(ValueError):
            f(bad)
    for bad in (2, 7, -1, "neuron:7", torch.device("neuron", 2)):
        with pytest.raises(AssertionError, match="Invalid device id"):
            f(bad)


def test_torch_accelerator_get_device_capability():
    allocatable = set()
    for dtype in {v for v in vars(torch).values() if isinstance(v, torch.dtype)}:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # complex32 is experimental
                torch.empty(2, dtype=dtype, device="neuron")
        except (RuntimeError, NotImplementedError):
            continue
        allocatable.add(dtype)
    cap = torch.accelerator.get_device_capability()
    assert cap["supported_dtypes"] == allocatable
    assert torch.accelerator.get_device_capability("neuron:1") == cap
    with pytest.raises(RuntimeError, match="Invalid device index"):
        torch.accelerator.get_device_capability(f"neuron:{torch.neuron.device_count()}")


def test_stream_context_like_torch_cuda():
    s0, s0b = torch.neuron.Stream(0), torch.neuron.Stream(0)
    s1, t1 = torch.neuron.Stream(1), torch.neuron.Stream(1)
    default0, default1 = torch.neuron.default_stream(0), torch.neuron.default_stream(1)
    assert isinstance(torch.neuron.stream(s0), torch.neuron.StreamContext)
    assert torch.neuron.current_device() == 0
    with torch.neuron.device(1):
        torch.neuron.set_stream(t1)  # device 1's current stream, to be restored
    try:
        with torch.neuron.StreamContext(s0) as entered:
            assert entered is None  # as torch.cuda's, __enter__ returns nothing
            assert torch.neuron.current_stream() == s0
            with torch.neuron.stream(s0b):  # nested, same device
                assert torch.neuron.current_stream() == s0b
            assert torch.neuron.current_stream() == s0
            with torch.neuron.StreamContext(s1):  # another device: it becomes current
                assert torch.neuron.current_device() == 1
                assert torch.neuron.current_stream() == s1
                y = torch.ones(1000, device="neuron:1") * 2
            assert torch.neuron.current_device() == 0 and torch.neuron.current_stream() == s0
            assert torch.neuron.current_stream(1) == t1
        assert torch.neuron.current_stream(0) == default0
        s1.synchronize()
        assert y.sum().item() == 2000
        with pytest.raises(ZeroDivisionError):  # restored when the block raises
            with torch.neuron.StreamContext(s1):
                1 / 0
        assert torch.neuron.current_device() == 0 and torch.neuron.current_stream() == default0
        assert torch.neuron.current_stream(1) == t1
        for none_context in (torch.neuron.StreamContext(None), torch.neuron.stream(None)):
            with none_context:
                assert torch.neuron.current_stream() == default0
    finally:
        torch.neuron.set_stream(default1)
        torch.neuron.set_device(0)


# At the machine's default LNC (2 on trn3, 1 on trn1): logical cores per device and HBM per logical core.
@pytest.mark.parametrize("machine, name, cores, hbm_gib", [("trn3", "NeuronCore-v4", 4, 36), ("trn1", "NeuronCore-v2", 2, 16)])
def test_machine_model_sets_the_device_properties(machine, name, cores, hbm_gib):
    """TORCHNEURON_MACHINE, which the NKI emulator reads too, names the devices and sizes their memory
    (tests/test_environment.py varies the LNC)."""
    r = run_python("import torch; p = torch.neuron.get_device_properties(0); "
                   "print(p.name, p.cores_per_device, p.total_memory, torch.neuron.get_device_capability(0))",
                   env={"TORCHNEURON_MACHINE": machine})
    host_share = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2 // 2
    assert r.stdout.split() == [name, "(emulated)", str(cores), str(min(hbm_gib << 30, host_share)),
                                f"({name[-1]},", "0)"], r.stderr


def test_invalid_machine_model_is_a_clear_error():
    r = run_python("import torch; torch.empty(1, device='neuron')", env={"TORCHNEURON_MACHINE": "gpu"})
    assert r.returncode != 0 and "TORCHNEURON_MACHINE='gpu' is invalid: expected trn2" in r.stderr


def test_runtime_and_nki_emulator_read_the_machine_setting_alike():
    from torchneuron import _C
    from torchneuron.nki import machine

    for alias in machine._ALIASES:
        key, core, cores, hbm_per_core = _C._machine_model(alias)
        m = machine.resolve_machine(alias)
        assert (key, core, cores, hbm_per_core) == (m.key, m.name, m.cores_per_device, m.hbm_bytes_per_core), alias
    with pytest.raises(ValueError, match="TORCHNEURON_MACHINE='tpu' is invalid"):
        _C._machine_model("tpu")


def test_utilization_is_the_busy_percent_of_the_past_second():
    assert list(inspect.signature(torch.neuron.utilization).parameters) == ["device"]
    x = torch.randn(512, 512, device="neuron")
    torch.neuron.synchronize()
    start = time.monotonic()
    while time.monotonic() - start < 0.6:  # the device busy for most of 0.6 s
        for _ in range(8):
            y = x @ x
        torch.neuron.synchronize()
    busy = torch.neuron.utilization()
    assert 40 <= busy <= 100, busy
    time.sleep(1.05)
    assert torch.neuron.utilization("neuron:0") == 0
    with pytest.raises(IndexError):
        torch.neuron.utilization(99)
    del y


def test_a_backward_as_the_last_statement_never_aborts_the_exit():
    """The autograd engine's device thread drops its last reference to a backward's
    GraphTask (which holds a Python object) after the caller has returned; if the
    interpreter is finalising by then, the process used to abort ("terminate called
    without an active exception") in a few runs of a hundred. The race is rare, so a
    few dozen short programs run, two at a time, on every device."""
    import concurrent.futures

    code = """
        import torch
        for i in range(torch.neuron.device_count()):
            m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(f"neuron:{i}")
            m(torch.randn(32, 64, device=f"neuron:{i}")).sum().backward()
        """
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda _: run_python(code), range(24)))
    failed = [r for r in runs if r.returncode != 0]
    assert not failed, f"{len(failed)} of {len(runs)} exits failed; first: {failed[0].returncode} {failed[0].stderr[-2000:]}"
