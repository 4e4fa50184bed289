"""Run-time redirection of CUDA for ``torchneuron-lockin run``: the only place
where ``torch.cuda`` and ``"cuda"`` devices are redirected, and only inside
:class:`Redirection`, which puts everything back on exit.

Inside it, a program written for CUDA runs on the target device (``neuron``,
or ``cpu`` for the reference run of a machine without CUDA), and every call
site that needed redirection is recorded:

* ``torch.cuda`` (the attribute, and ``sys.modules["torch.cuda"]`` and
  ``["torch.cuda.amp"]`` for imports) is a proxy module: program code gets the
  target's device module (``torch.neuron``, whose functions have
  ``torch.cuda``'s signatures, or a CPU stand-in), PyTorch's own code keeps
  the real ``torch.cuda``;
* a ``TorchFunctionMode`` rewrites ``"cuda"``/``"cuda:N"`` strings and CUDA
  ``torch.device`` arguments of every torch call, ``.cuda()`` and
  ``.is_cuda``; for the CPU target also integer devices and ``neuron`` devices
  (there is no accelerator in that run);
* ``torch.autocast``, ``torch.amp.autocast`` and ``torch.amp.GradScaler`` take
  the target for ``"cuda"``; ``torch.backends.cudnn`` records the settings a
  program makes; ``init_process_group`` takes the target's backend for NCCL
  (``neuron``, torchneuron/distributed.py's; gloo on the CPU target);
* ``torch.load`` maps ``map_location="cuda"`` (a string, a device, the values
  of a dict) to the target, and storages saved on CUDA to the target when
  the program gives no ``map_location``; ``torch.Generator("cuda")`` is the
  target's generator; ``ProfilerActivity.CUDA`` in ``torch.profiler.profile``
  is the device's activity (``PrivateUse1``; dropped on the CPU target).

Each record says what was redirected and to what (``what``, ``to``), for the
report's list of redirections.

A call site is the innermost frame outside torch and this package; when that
frame is in a library, the innermost frame in the program's own files is
recorded with it, so the program's line counts and the library's is named.
"""
from __future__ import annotations

import contextlib
import functools
import linecache
import os
import re
import sys
import threading
import time
import types

import torch
from torch.overrides import TorchFunctionMode

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_THIS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_DEVICE_STRING = re.compile(r"^cuda(:(\d+))?$")
_INTERNAL_PREFIXES = ("<frozen", "<string>")


class RedirectedSites:
    """The call sites that needed redirection, with the program's own files."""

    def __init__(self, program_files: list[str]):
        self.program_roots = [os.path.abspath(p) for p in program_files]
        self.sites: list[dict] = []
        self._seen: set = set()
        # for a notebook: (the file name its code runs under, line -> (cell, line in the cell), its path)
        self.line_map = None
        self._lock = threading.Lock()

    def in_program(self, filename: str) -> bool:
        path = os.path.abspath(filename)
        return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in self.program_roots)

    def record(self, rule: str, what: str, value=None, to: str | None = None) -> None:
        """``value``: the device string or integer that was redirected, for the
        report to tell a literal it already found from one built at run time."""
        frame = sys._getframe(1)
        site = program = None
        while frame is not None:
            name = frame.f_code.co_filename
            if site is not None and name.startswith("<frozen importlib"):
                break   # a library's import-time access: the program's import line is not the tie
            if not (name.startswith(_TORCH_DIR) or name.startswith(_THIS_DIR) or name.startswith(_INTERNAL_PREFIXES)
                    or "importlib" in name or name.endswith("runpy.py")):
                if site is None:
                    site = frame
                if self.in_program(name):
                    program = frame
                    break
            frame = frame.f_back
        if site is None:
            return
        key = (site.f_code.co_filename, site.f_lineno, rule)   # a line's first record of each rule
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
            record = {"rule": rule, "what": what, "path": None, "line": None,
                      "value": value if isinstance(value, (str, int)) else None, "to": to}
            if program is not None:
                line, cell = program.f_lineno, None
                if self.line_map is not None and program.f_code.co_filename == self.line_map[0]:
                    cell, line = self.line_map[1](line)
                record.update(path=self.line_map[2] if cell is not None else program.f_code.co_filename,
                              line=line, cell=cell,
                              snippet=linecache.getline(program.f_code.co_filename, program.f_lineno).strip())
            if site is not program:
                record.update(library_path=site.f_code.co_filename, library_line=site.f_lineno)
            self.sites.append(record)


def _called_from_torch(depth: int = 2) -> bool:
    name = sys._getframe(depth).f_code.co_filename
    return name.startswith(_TORCH_DIR) or name.startswith(_THIS_DIR)


# -- the CPU stand-in for torch.cuda ------------------------------------------------------------

class _CpuEvent:
    """``torch.cuda.Event`` on a machine whose only device is the host: a clock reading."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def wait(self, stream=None):
        pass

    def query(self):
        return True

    def elapsed_time(self, end):
        return (end.t - self.t) * 1000.0


class _CpuStream(contextlib.nullcontext):
    def __init__(self, device=None, priority=0, **kwargs):
        super().__init__()

    def synchronize(self):
        pass

    def wait_stream(self, stream):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        event = event or _CpuEvent()
        event.record()
        return event

    def query(self):
        return True


def _noop(*args, **kwargs):
    return None


def _zero(*args, **kwargs):
    return 0


def _cpu_device_module() -> types.SimpleNamespace:
    props = types.SimpleNamespace(name="cpu", total_memory=0, major=0, minor=0, multi_processor_count=1)
    names = dict(
        is_available=lambda: True, device_count=lambda: 1, current_device=lambda: 0, set_device=_noop,
        synchronize=_noop, empty_cache=_noop, ipc_collect=_noop, is_initialized=lambda: True, init=_noop,
        # the CPU generator is the host's: seeding it here would change the host's draws
        manual_seed=_noop, manual_seed_all=_noop, seed=_noop, seed_all=_noop, initial_seed=torch.initial_seed,
        get_device_name=lambda device=None: "cpu", get_device_capability=lambda device=None: (0, 0),
        get_device_properties=lambda device=None: props, is_bf16_supported=lambda *a, **k: True,
        memory_allocated=_zero, max_memory_allocated=_zero, memory_reserved=_zero, max_memory_reserved=_zero,
        reset_peak_memory_stats=_noop, reset_accumulated_memory_stats=_noop, reset_max_memory_allocated=_noop,
        memory_stats=lambda device=None: {}, mem_get_info=lambda device=None: (0, 0),
        memory_summary=lambda *a, **k: "", Event=_CpuEvent, Stream=_CpuStream,
        current_stream=lambda device=None: _CpuStream(), default_stream=lambda device=None: _CpuStream(),
        stream=lambda s=None: contextlib.nullcontext(), set_stream=_noop,
        device=lambda d=None: contextlib.nullcontext(), OutOfMemoryError=torch.OutOfMemoryError)
    return types.SimpleNamespace(**names)


def _amp_namespace(target: str) -> types.SimpleNamespace:
    def autocast(enabled=True, dtype=torch.float16, cache_enabled=True):
        return torch.amp.autocast(target, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    def GradScaler(*args, **kwargs):   # noqa: N802  (torch.cuda.amp's name)
        return _ORIGINAL_GRAD_SCALER(target, *args, **kwargs)

    def custom_fwd(fwd=None, *, cast_inputs=None):
        return torch.amp.custom_fwd(fwd, device_type=target, cast_inputs=cast_inputs)

    def custom_bwd(bwd=None):
        return torch.amp.custom_bwd(bwd, device_type=target)

    return types.SimpleNamespace(autocast=autocast, GradScaler=GradScaler, custom_fwd=custom_fwd,
                                 custom_bwd=custom_bwd)


_ORIGINAL_GRAD_SCALER = torch.amp.GradScaler
_ORIGINAL_AUTOCAST = torch.amp.autocast_mode.autocast


class _ProxyModule(types.ModuleType):
    """A module whose attributes, for program code, come from ``redirected`` (recorded),
    and for PyTorch's own code from the real module."""

    def __init__(self, name: str, real: types.ModuleType, redirected, recorder: RedirectedSites, rule: str,
                 submodules: dict | None = None):
        super().__init__(name)
        object.__setattr__(self, "_real", real)
        object.__setattr__(self, "_redirected", redirected)
        object.__setattr__(self, "_recorder", recorder)
        object.__setattr__(self, "_rule", rule)
        object.__setattr__(self, "_submodules", submodules or {})

    def __getattr__(self, attr):
        real = object.__getattribute__(self, "_real")
        if attr.startswith("__") or _called_from_torch():
            return getattr(real, attr)
        submodules = object.__getattribute__(self, "_submodules")
        recorder = object.__getattribute__(self, "_recorder")
        rule = object.__getattribute__(self, "_rule")
        if attr in submodules:
            recorder.record(rule, f"{self.__name__}.{attr}")
            return submodules[attr]
        redirected = object.__getattribute__(self, "_redirected")
        value = getattr(redirected, attr, None)
        if value is None:
            return getattr(real, attr)   # nothing to redirect to: the real one, which may fail
        recorder.record(rule, f"{self.__name__}.{attr}")
        if callable(value) and not isinstance(value, type):
            return _recording(value, recorder, rule, f"{self.__name__}.{attr}")
        return value

    def __setattr__(self, attr, value):
        if not _called_from_torch():
            object.__getattribute__(self, "_recorder").record(object.__getattribute__(self, "_rule"),
                                                             f"sets {self.__name__}.{attr}")
        setattr(object.__getattribute__(self, "_real"), attr, value)

    def __dir__(self):
        return dir(object.__getattribute__(self, "_real"))


def _recording(fn, recorder: RedirectedSites, rule: str, what: str):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        recorder.record(rule, what + "()")
        return fn(*args, **kwargs)
    return call


class _DeviceMode(TorchFunctionMode):
    """Rewrites CUDA devices in the arguments of every torch call."""

    def __init__(self, target: str, recorder: RedirectedSites):
        super().__init__()
        self.target = target
        self.recorder = recorder
        self.is_cuda_getter = torch.Tensor.is_cuda.__get__   # a method-wrapper: compared with ==

    def device(self, value, index_ok=True):
        """The target for a CUDA device, of the same kind (a string for a string);
        None: not one to rewrite."""
        if isinstance(value, str):
            m = _DEVICE_STRING.match(value)
            if m is not None:
                return str(self.make(int(m.group(2)) if m.group(2) else None))
            if self.target == "cpu" and value.split(":")[0] == "neuron":
                return "cpu"
            return None
        if isinstance(value, torch.device):
            if value.type == "cuda" or (self.target == "cpu" and value.type not in ("cpu", "meta")):
                return self.make(value.index)
            return None
        if self.target == "cpu" and index_ok and type(value) is int:
            return torch.device("cpu")
        return None

    def make(self, index):
        if self.target == "cpu" or index is None:
            return torch.device(self.target)
        return torch.device(self.target, index)

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            self.recorder.record("TNL001", ".cuda()", to=self.target)
            device = args[1] if len(args) > 1 else kwargs.pop("device", None)
            if device is None:
                target = self.make(None)
            elif type(device) is int:
                target = self.device(device) or self.make(device)
            else:   # a torch.device or a string: CUDA's become the target, the others stay
                target = self.device(device) or device
            kwargs.pop("device", None)
            return args[0].to(target, **kwargs)
        if func == self.is_cuda_getter:
            self.recorder.record("TNL002", ".is_cuda")
            return args[0].device.type == self.target
        changed = None
        new_args = list(args)
        positional_int_ok = func in (torch.Tensor.to,)
        for i, a in enumerate(args):
            if isinstance(a, (str, torch.device)) or (positional_int_ok and type(a) is int and i == 1):
                d = self.device(a)
                if d is not None:
                    new_args[i], changed = d, a
        for k in ("device", "map_location"):
            if k in kwargs:
                d = self.device(kwargs[k])
                if d is not None:
                    changed = kwargs[k]
                    kwargs = {**kwargs, k: d}
        if changed is not None:
            self.recorder.record("TNL003", f"device {changed!r} in {getattr(func, '__name__', func)}", changed,
                                 to=self.target)
        return func(*new_args, **kwargs)


def _device_type_subclass(base, target: str, recorder: RedirectedSites, what: str, default_cuda: bool):
    """``base`` (autocast or GradScaler) whose device type "cuda" is the target."""

    class Redirected(base):
        def __init__(self, device_type=None, *args, **kwargs):
            if device_type is None:
                device_type = kwargs.pop("device", None) or kwargs.pop("device_type", None)
            if device_type is None and default_cuda:
                device_type = "cuda"
            if device_type == "cuda" and not _called_from_torch():
                recorder.record("TNL006" if default_cuda else "TNL003", f"{what}('cuda')", "cuda", to=target)
                device_type = target
            elif device_type == "cuda":
                device_type = target
            super().__init__(device_type, *args, **kwargs)

    Redirected.__name__ = Redirected.__qualname__ = base.__name__
    Redirected.__module__ = base.__module__
    return Redirected


def _cpu_ddp(base, recorder: RedirectedSites):
    class DistributedDataParallel(base):
        def __init__(self, module, device_ids=None, output_device=None, *args, **kwargs):
            if device_ids is not None or output_device is not None:
                recorder.record("TNL003", "DistributedDataParallel(device_ids=...)")
            super().__init__(module, None, None, *args, **kwargs)

    DistributedDataParallel.__module__ = base.__module__
    return DistributedDataParallel


def _neuron_backend() -> str:
    import torchneuron.distributed  # noqa: F401  (registers the backend)
    return "neuron"


def _without_nccl(backend: str, replacement: str, target: str) -> str:
    """"nccl" -> the target's backend; "cpu:gloo,cuda:nccl" -> "cpu:gloo,neuron:neuron"
    ("cpu:gloo" alone on the CPU target)."""
    if ":" not in backend:
        return replacement
    parts = []
    for part in backend.split(","):
        device, _, name = part.partition(":")
        if device == "cuda" or name == "nccl":
            if target == "cpu":
                continue
            part = f"{target}:{replacement}"
        parts.append(part)
    return ",".join(dict.fromkeys(parts)) or "gloo"


def _load(original, target: str, recorder: RedirectedSites):
    """torch.load whose CUDA locations are the target."""
    from torch.serialization import default_restore_location

    def location(value):
        if isinstance(value, torch.device) and value.type == "cuda":
            return str(torch.device(target) if target == "cpu" or value.index is None
                       else torch.device(target, value.index))
        if isinstance(value, str):
            m = _DEVICE_STRING.match(value)
            if m is not None:
                return target if target == "cpu" or m.group(2) is None else f"{target}:{m.group(2)}"
        return None

    def saved_on_cuda(storage, where):   # no map_location: a checkpoint saved on CUDA
        new = location(where)
        if new is None:
            return None
        recorder.record("TNL003", f"torch.load of a storage saved on {where!r}", where, to=new)
        return default_restore_location(storage, new)

    @functools.wraps(original)
    def load(f, map_location=None, *args, **kwargs):
        if map_location is None:
            map_location = saved_on_cuda
        elif isinstance(map_location, dict):
            mapped = {k: location(v) or v for k, v in map_location.items()}
            if mapped != map_location:
                recorder.record("TNL003", f"torch.load(map_location={map_location!r})", None, to=str(mapped))
                map_location = mapped
        elif location(map_location) is not None:
            new = location(map_location)
            recorder.record("TNL003", f"torch.load(map_location={str(map_location)!r})", str(map_location), to=new)
            map_location = new
        return original(f, map_location, *args, **kwargs)

    return load


def _generator(original, target: str, recorder: RedirectedSites):
    """torch.Generator whose "cuda" device is the target (a subclass: isinstance holds)."""

    class _Type(type(original)):
        def __instancecheck__(cls, obj):   # generators made before the redirection are generators too
            return isinstance(obj, original)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, original)

    class Generator(original, metaclass=_Type):
        def __new__(cls, device="cpu"):
            is_cuda = (isinstance(device, str) and _DEVICE_STRING.match(device) is not None) or \
                (isinstance(device, torch.device) and device.type == "cuda")
            if is_cuda:
                index = torch.device(device).index
                new = torch.device(target) if target == "cpu" or index is None else torch.device(target, index)
                recorder.record("TNL003", f"torch.Generator({str(device)!r})", str(device), to=str(new))
                device = new
            return original.__new__(cls, device)

        def __init__(self, device="cpu"):
            pass

    Generator.__name__ = Generator.__qualname__ = "Generator"
    Generator.__module__ = original.__module__
    return Generator


def _profile(original, target: str, recorder: RedirectedSites):
    """torch.profiler.profile whose ProfilerActivity.CUDA is the device's activity."""
    from torch.profiler import ProfilerActivity

    class profile(original):   # noqa: N801  (torch's name)
        def __init__(self, *args, activities=None, **kwargs):
            if activities is not None and ProfilerActivity.CUDA in activities:
                device = [] if target == "cpu" else [ProfilerActivity.PrivateUse1]
                new = [a for a in activities if a != ProfilerActivity.CUDA] + device
                new = list(dict.fromkeys(new))
                recorder.record("TNL023", "torch.profiler.profile(activities=[ProfilerActivity.CUDA])",
                                to=", ".join(f"ProfilerActivity.{a.name}" for a in new))
                activities = new
            super().__init__(*args, activities=activities, **kwargs)

    profile.__module__ = original.__module__
    return profile


class Redirection(contextlib.AbstractContextManager):
    """Inside it, CUDA means ``target``; ``recorder.sites`` lists what needed it."""

    def __init__(self, target: str = "neuron", program_files: list[str] | None = None):
        if target not in ("neuron", "cpu"):
            raise ValueError(f"target must be 'neuron' or 'cpu', not {target!r}")
        self.target = target
        self.recorder = RedirectedSites(program_files or [])
        self._undo: list = []

    @property
    def sites(self) -> list[dict]:
        return self.recorder.sites

    def _set(self, obj, name, value):
        had = name in vars(obj)
        old = vars(obj).get(name)
        setattr(obj, name, value)
        self._undo.append(lambda: setattr(obj, name, old) if had else delattr(obj, name))

    def _set_module(self, name, module):
        old = sys.modules.get(name)
        sys.modules[name] = module
        self._undo.append(lambda: sys.modules.__setitem__(name, old) if old is not None else sys.modules.pop(name))

    def __enter__(self):
        import torch.distributed as dist

        rec, target = self.recorder, self.target
        real_cuda = sys.modules["torch.cuda"]
        device_module = torch.neuron if target == "neuron" else _cpu_device_module()
        amp = _ProxyModule("torch.cuda.amp", real_cuda.amp, _amp_namespace(target), rec, "TNL006")
        cuda = _ProxyModule("torch.cuda", real_cuda, device_module, rec, "TNL004", {"amp": amp})
        cudnn = _ProxyModule("torch.backends.cudnn", torch.backends.cudnn, torch.backends.cudnn, rec, "TNL007")
        self._set_module("torch.cuda", cuda)
        self._set_module("torch.cuda.amp", amp)
        self._set(torch, "cuda", cuda)
        self._set(torch.backends, "cudnn", cudnn)
        autocast = _device_type_subclass(_ORIGINAL_AUTOCAST, target, rec, "torch.autocast", False)
        self._set(torch, "autocast", autocast)
        self._set(torch.amp, "autocast", autocast)
        self._set(torch.amp, "GradScaler", _device_type_subclass(_ORIGINAL_GRAD_SCALER, target, rec,
                                                                 "torch.amp.GradScaler", True))
        original_init = dist.init_process_group

        backend_of_target = "gloo" if target == "cpu" else _neuron_backend()

        @functools.wraps(original_init)
        def init_process_group(backend=None, *args, **kwargs):
            if "backend" in kwargs:
                backend = kwargs.pop("backend")
            if isinstance(backend, str) and "nccl" in backend:
                new = _without_nccl(backend, backend_of_target, target)
                rec.record("TNL010", f"init_process_group({backend!r})", to=new)
                backend = new
            return original_init(backend, *args, **kwargs)

        self._set(dist, "init_process_group", init_process_group)
        self._set(dist.distributed_c10d, "init_process_group", init_process_group)
        self._set(torch, "load", _load(torch.load, target, rec))
        self._set(torch, "Generator", _generator(torch.Generator, target, rec))
        self._set(torch.profiler, "profile", _profile(torch.profiler.profile, target, rec))
        if target == "cpu":   # device_ids name accelerator devices; a CPU module takes none
            ddp = _cpu_ddp(torch.nn.parallel.DistributedDataParallel, rec)
            self._set(torch.nn.parallel, "DistributedDataParallel", ddp)
        # torch function modes are per thread: threads started inside (a loader's pool) get their own
        thread_run = threading.Thread.run

        def run(thread):
            with _DeviceMode(target, rec):
                thread_run(thread)

        self._set(threading.Thread, "run", run)
        self.mode = _DeviceMode(target, rec)
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)
        while self._undo:
            self._undo.pop()()
        return False
