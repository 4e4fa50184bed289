"""``@nki.jit``: launching kernels on host buffers, with SPMD grids.

A launch runs the kernel body once per point of its grid, in order, each
instance with its own SBUF/PSUM accounting and program id.  Arguments that
are arrays become HBM tensors *viewing the caller's memory* (no copy), so
the device side can pass aliases of device memory and get results written
in place; ``shared_hbm`` outputs are created through a pluggable allocator
for the same reason.  Framework tensors (torch) are handed to an adapter
(``torchneuron.nki.torch_bridge``) that is imported only when such an
argument is seen, so importing this package never imports torch.
"""
from __future__ import annotations

import functools
import importlib
import itertools
import threading
import weakref

import numpy as np

from .context import InstanceState, LaunchState, in_kernel, running
from .errors import NKIError
from .machine import Buffer, resolve_machine
from .tensor import NkiTensor, wrap_host_array
from . import dtypes as _dt
from . import lnc
from .instruction import counting
from .lower import replay
from .recorder import Recorder
from .trace import TraceCache

# Adapters for framework tensors: objects with ``accepts(args, kwargs)`` and
# ``launch(kernel, grid, args, kwargs)``.  Modules listed in _LAZY_ADAPTERS
# register themselves when imported.
_ADAPTERS: list = []
_LAZY_ADAPTERS = {"torch": "torchneuron.nki.torch_bridge"}


# Kernels by a number given at decoration: compiled code names a kernel by a plain int, which
# torch.compile can carry as a constant where it could not carry the kernel object
# (torch_bridge.compiled_call).
_kernel_numbers = itertools.count(1)
_kernels_by_number: "weakref.WeakValueDictionary[int, Kernel]" = weakref.WeakValueDictionary()


def kernel_by_number(number: int) -> "Kernel":
    """The ``@nki.jit`` kernel whose ``number`` this is (KeyError if it is gone)."""
    return _kernels_by_number[number]


def register_adapter(adapter):
    """Let a framework bridge run kernels called with its tensor type."""
    if adapter not in _ADAPTERS:
        _ADAPTERS.append(adapter)


def _framework_of(values):
    for v in values:
        mod = type(v).__module__.split(".")[0]
        if mod in _LAZY_ADAPTERS:
            return mod
    return None


_blas_lock = threading.Lock()
_blas_limited = False


def _limit_blas_to_one_thread():
    """BLAS on one thread from the first launch on, for the process: a tile
    GEMM (at most 128 x 128 x 512) is too small to pay for waking a thread pool
    per call, least of all on a busy host (parallelism belongs to the device's
    streams), and the bits of OpenBLAS's Haswell kernels, which AVX2 hosts run,
    depend on its thread count. The count is the process's: set and restored
    around each launch, it would change under a concurrent launch, so it is set
    once and kept; NumPy's own BLAS calls in the process then run on one thread
    too (docs/nki.md)."""
    global _blas_limited
    if not _blas_limited:
        with _blas_lock:
            if not _blas_limited:
                try:
                    from threadpoolctl import ThreadpoolController
                    ThreadpoolController().limit(limits=1, user_api="blas")
                except ImportError:  # optional: without it BLAS keeps its default threads
                    pass
                _blas_limited = True


def run_on_host_buffers(fn, grid, args, kwargs, *, hbm_allocator=None, target=None, debug=None,
                        kernel_name=None, cache=None, profile=None, written=None):
    """Run ``fn`` on the emulator with NumPy-compatible buffers.

    This is the seam for device integration: every ``np.ndarray`` in ``args``
    and ``kwargs`` (top level, or inside lists/tuples) is viewed as an HBM
    tensor without copying; ``hbm_allocator(shape, np_dtype)`` creates the
    storage of ``shared_hbm`` outputs (NumPy zeros/garbage by default).
    With a ``cache`` (``trace.TraceCache``) the launch replays the program
    recorded for its signature, or records one.  With ``profile`` (a
    ``recorder.Recorder``) the launch is interpreted and its instructions are
    recorded for the performance model.  Returns the kernel's return value
    with HBM tensors replaced by their arrays.
    """
    grid = tuple(int(g) for g in grid)
    launch = LaunchState(grid, target=target, debug=debug, hbm_allocator=hbm_allocator,
                         kernel_name=kernel_name or getattr(fn, "__name__", "kernel"))
    copy_back = []
    inputs = []
    originals = []

    def wrap(v, name):
        if isinstance(v, np.ndarray):
            arr = v
            if not v.flags.c_contiguous or not v.flags.writeable:
                # HBM views must be contiguous; a strided argument is staged
                # through a copy and written back after the launch.
                arr = np.ascontiguousarray(v).copy()
                if v.flags.writeable:
                    copy_back.append((v, arr))
            inputs.append(wrap_host_array(arr, Buffer.hbm, name))
            originals.append(v)
            return inputs[-1]
        if isinstance(v, (list, tuple)) and any(isinstance(x, np.ndarray) for x in v):
            return type(v)(wrap(x, f"{name}[{i}]") for i, x in enumerate(v))
        return v

    names = _param_names(fn)
    wargs = [wrap(a, names[i] if i < len(names) else f"arg{i}") for i, a in enumerate(args)]
    wkwargs = {k: wrap(v, k) for k, v in kwargs.items()}
    del wrap  # (recursive: a cycle that would keep the arguments until a garbage collection)
    points = list(itertools.product(*[range(g) for g in grid])) if grid else [()]
    if profile is not None or written is not None:
        cache = None
    launch.profile = profile
    key = cache.key(grid, launch, args, kwargs) if cache is not None and cache.enabled() else None
    program = cache.lookup(key) if cache is not None else False
    _limit_blas_to_one_thread()
    if program:
        cache.count("replays")
        launch.account_memory = False
        result = replay(program, launch, inputs)
    elif program is None:
        cache.count("traces")
        with Recorder(inputs) as rec:
            result = _interpret(fn, launch, points, wargs, wkwargs, rec)
        cache.store(key, rec.finish(result), rec.reason)
    else:
        if cache is not None:
            cache.count("interpreted")
        result = _interpret(fn, launch, points, wargs, wkwargs, None)
    for orig, staged in copy_back:
        np.copyto(orig, staged)
    if written is not None:
        written.extend(orig for orig, t in zip(originals, inputs) if t._alloc.stored)
    return _unwrap(result)


def _interpret(fn, launch, points, wargs, wkwargs, rec):
    """Run the kernel's Python once per grid point (recording its instructions if ``rec``).

    The two instances of an LNC-2 launch (grid ``(2,)``) run as the two cores of a
    logical NeuronCore, which may exchange tiles and wait for each other (lnc.py)."""
    results = {}

    def run_instance(pid):
        if rec is not None:
            rec.begin_instance(pid)
        state = InstanceState(launch, pid)
        live = state.liveness
        if live is not None and launch.profile is not None:
            launch.profile.instance = pid
            launch.profile.lives.append((pid, live))
            live.profile = launch.profile
        with running(state), counting(live):
            results[pid] = fn(*wargs, **wkwargs)
        if live is not None:
            live.check()

    if launch.grid == lnc.PAIR:
        def on_core_thread(pid):
            prev = rec.attach_thread() if rec is not None else None
            try:
                run_instance(pid)
            finally:
                if rec is not None:
                    rec.detach_thread(prev)
        lnc.run_pair(on_core_thread, points)
    else:
        for pid in points:
            run_instance(pid)
    return results.get(points[-1])


@functools.lru_cache(maxsize=None)
def _param_names_cached(code):
    return code.co_varnames[:code.co_argcount]


def _param_names(fn):
    code = getattr(fn, "__code__", None)
    return _param_names_cached(code) if code is not None else ()


def _unwrap(value):
    if isinstance(value, NkiTensor):
        if value.buffer.on_chip:
            raise NKIError("a kernel can only return HBM tensors (declare outputs with buffer=nl.shared_hbm)")
        out = value._alloc.data if value._is_whole() else np.array(value.read())
        if isinstance(value.dtype, _dt.Packed):  # an MX x4 output keeps its type on the host
            out = _dt.PackedArray(out, value.dtype)
        return out
    if isinstance(value, tuple):
        return tuple(_unwrap(v) for v in value)
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    if isinstance(value, dict):
        return {k: _unwrap(v) for k, v in value.items()}
    return value


class Kernel:
    """A function decorated with ``@nki.jit``.

    ``kernel(*args)`` runs one instance; ``kernel[gx, gy](*args)`` runs an
    SPMD grid (in NKI 0.x, ``kernel[2]`` is the logical-NeuronCore degree:
    two instances, ``nl.program_id(0)`` 0 and 1).  Options: ``target=`` or
    ``platform_target=`` (a machine model: ``"trn2"``, ``"trn3"``, ``"v3"``,
    ...; default the ``set_machine``/TORCHNEURON_MACHINE setting),
    ``debug=True`` (uninitialised memory is NaN/garbage), ``trace_cache=False``
    (interpret every call; the default follows TORCHNEURON_NKI_TRACE_CACHE, on
    unless it is 0).  Other keyword options of the real decorator (mode,
    additional_compile_opt, ...) are accepted and ignored.

    Called inside another kernel with tiles, a kernel runs inline as a
    subroutine of the caller, as the compiler inlines it.
    """

    def __init__(self, fn, *, grid=(), target=None, debug=None, trace_cache=None, platform_target=None,
                 **options):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.grid = tuple(grid)
        target = target if target is not None else platform_target
        self.target = resolve_machine(target) if target is not None else None
        self.debug = debug
        self.options = options
        # shared by kernel[grid] copies: the grid is part of the signature
        self._traces = TraceCache(trace_cache)
        # shared by kernel[grid] copies too, which differ from this kernel only in their grid
        self.number = next(_kernel_numbers)
        _kernels_by_number[self.number] = self

    def cache_info(self):
        """Trace-cache counters: ``signatures`` recorded, launches that ``traces`` (recorded),
        ``replays`` and ``interpreted`` (cache off, unhashable arguments, or unreplayable
        signatures, whose reasons are listed in ``unreplayable``)."""
        return self._traces.info()

    def cache_clear(self):
        """Forget the recorded programs and reset the counters."""
        self._traces.clear()

    def __getitem__(self, grid):
        if not isinstance(grid, tuple):
            grid = (grid,)
        k = Kernel.__new__(Kernel)
        k.__dict__.update(self.__dict__)
        k.grid = tuple(int(g) for g in grid)
        # the number must keep naming a kernel of this function while a copy lives
        _kernels_by_number.setdefault(k.number, k)
        return k

    def __call__(self, *args, **kwargs):
        if in_kernel() and not self.grid and _has_tile(args, kwargs):
            return self.fn(*args, **kwargs)
        fw = _framework_of(list(args) + list(kwargs.values()))
        if fw is not None:
            importlib.import_module(_LAZY_ADAPTERS[fw])
            for adapter in _ADAPTERS:
                if adapter.accepts(args, kwargs):
                    return adapter.launch(self, self.grid, args, kwargs)
            raise NKIError(f"no integration is registered for {fw} tensors")
        return run_on_host_buffers(self.fn, self.grid, args, kwargs, target=self.target, debug=self.debug,
                                   kernel_name=self.fn.__name__, cache=self._traces)

    def __repr__(self):
        return f"<nki.jit kernel {self.fn.__name__} grid={self.grid}>"


def _has_tile(args, kwargs):
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, NkiTensor) or (isinstance(v, (list, tuple)) and any(isinstance(x, NkiTensor) for x in v)):
            return True
    return False


def jit(fn=None, mode="auto", **options):
    """Decorate an NKI kernel: ``@nki.jit`` or ``@nki.jit(debug=True)``.

    ``mode`` (upstream: "auto", "baremetal", "simulation", "torchxla", "jax",
    "benchmark") is accepted; every mode runs on the emulator, the framework
    being taken from the arguments.
    """
    if fn is None:
        return lambda f: Kernel(f, **options)
    if isinstance(fn, Kernel):
        return fn
    return Kernel(fn, **options)


def simulate_kernel(kernel, *args, **kwargs):
    """Upstream's ``nki.simulate_kernel(kernel[grid], *numpy_args)``: run on NumPy arrays."""
    if isinstance(kernel, Kernel):
        return run_on_host_buffers(kernel.fn, kernel.grid, args, kwargs, target=kernel.target,
                                   debug=kernel.debug, kernel_name=kernel.fn.__name__, cache=kernel._traces)
    return run_on_host_buffers(kernel, (), args, kwargs)


def simulate(kernel):
    """``nki.simulate(kernel)``: the kernel as a callable that runs it on the CPU.

    NumPy arguments give NumPy results; torch tensors give torch tensors (on
    their device: CPU tensors run synchronously on the host).  A plain
    function is wrapped with ``jit`` first; ``nki.simulate(kernel[2])``
    keeps the grid."""
    k = kernel if isinstance(kernel, Kernel) else Kernel(kernel)

    @functools.wraps(k.fn)
    def simulated(*args, **kwargs):
        return k(*args, **kwargs)
    simulated.kernel = k
    return simulated
