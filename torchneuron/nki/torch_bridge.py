"""Running ``@nki.jit`` kernels on torch tensors, and ``nki_op``.

Imported lazily by ``Kernel.__call__`` the first time a kernel sees a torch
tensor (or by ``nki_op``), so ``import torchneuron.nki`` alone never imports
torch.

How a call on ``neuron`` tensors runs
-------------------------------------
1. **Output specification, per signature.**  The signature is the kernel, its
   grid and options, and every argument (tensors by shape and dtype, other
   values by value).  An NKI kernel's outputs are a function of the
   signature only: the kernel's Python sees shapes and dtypes, never data
   (the host cannot read device memory while tracing a kernel).  On the first
   call of a signature we run the kernel's Python once on the emulator over
   zero-filled host inputs (a "shape trace", done at launch, on the host,
   without waiting for the device) and record the ``shared_hbm`` tensors it
   allocates, in order, and what it returns.  Later calls reuse the record.
2. **Launch.**  The host allocates the ``shared_hbm`` outputs as ``neuron``
   tensors from that record and queues ONE task named ``nki::<kernel name>``
   on the current stream of the tensors' device (torchneuron/_python_tasks.py,
   csrc/bridge/python_tasks/python_tasks.cpp), and returns.  The caller gets the outputs at once; Python runs ahead.
3. **Execution.**  The task runs on the stream's executor thread, after the
   work queued before it and before the work queued after it.  It takes the
   GIL and runs the emulator (``_execute`` here) on NumPy views of CPU
   aliases of the device memory (no copies).  The kernel's ``shared_hbm`` allocations are
   handed the preallocated outputs in order (a mismatch with the record is
   an error).
4. **Errors.**  An error in the task is kept by the device and raised at the
   next synchronising call (``.cpu()``, ``.item()``, ``synchronize()``) as a
   ``RuntimeError`` naming the task ``nki::<kernel>``, the original exception
   and the kernel's source line.  Errors found by the shape trace (limits, bad
   indexing) are raised at the call itself, with their own exception type.

CPU tensors run synchronously on the host, on views of their memory.  Fake
and meta tensors (``torch.compile`` tracing, ``nki_op``'s fake
implementation) get empty outputs of the recorded shapes, and nothing runs.
Calling a kernel directly records no autograd history; use ``nki_op`` with
``register_autograd`` for that.
"""
from __future__ import annotations

import functools
import threading

import numpy as np
import torch

from . import dtypes as _dt
from .errors import NKIError, NKITypeError
from .jit import Kernel, register_adapter, run_on_host_buffers
from .. import _torch_patches
from .._python_tasks import launch as python_task

__all__ = ["nki_op", "clear_signature_cache", "signature_cache_info"]


# ---------------------------------------------------------------------------
# dtypes and host views

_TORCH_TO_NP = {
    torch.float32: np.dtype(np.float32), torch.float16: np.dtype(np.float16),
    torch.bfloat16: _dt.bfloat16, torch.float64: np.dtype(np.float64),
    torch.int8: np.dtype(np.int8), torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32), torch.int64: np.dtype(np.int64),
    torch.uint8: np.dtype(np.uint8), torch.bool: np.dtype(np.bool_),
    torch.float8_e4m3fn: _dt.float8_e4m3fn, torch.float8_e5m2: _dt.float8_e5m2,
}
for _name in ("uint16", "uint32"):
    if hasattr(torch, _name):
        _TORCH_TO_NP[getattr(torch, _name)] = np.dtype(_name)
_NP_TO_TORCH = {v: k for k, v in _TORCH_TO_NP.items()}
# dtypes torch.Tensor.numpy() handles itself; others go through a same-size integer view
_NUMPY_NATIVE = {torch.float32, torch.float16, torch.float64, torch.int8, torch.int16, torch.int32,
                 torch.int64, torch.uint8, torch.bool}
_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _np_dtype(t: torch.Tensor) -> np.dtype:
    try:
        return _TORCH_TO_NP[t.dtype]
    except KeyError:
        raise NKITypeError(f"NKI kernels cannot take {t.dtype} tensors", location="<kernel call>") from None


def _torch_dtype(d: np.dtype, kernel_name: str) -> torch.dtype:
    try:
        return _NP_TO_TORCH[np.dtype(d)]
    except KeyError:
        raise NKITypeError(f"kernel {kernel_name} returns a {np.dtype(d).name} tensor, which torch has no "
                           "dtype for (use float8_e4m3fn rather than float8_e4m3)",
                           location="<kernel call>") from None


def host_view(t: torch.Tensor) -> np.ndarray:
    """A NumPy array over the memory of CPU tensor ``t`` (no copy; strides kept)."""
    t = t.detach()
    if t.dtype in _NUMPY_NATIVE:
        return t.numpy()
    target = _np_dtype(t)
    return t.view(_SAME_SIZE_INT[t.element_size()]).numpy().view(target)


# ---------------------------------------------------------------------------
# arguments: tensors become slots, the rest is kept by value

class _Slot:
    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index


def _flatten(value, tensors):
    """Replace tensors in ``value`` (top level, lists, tuples) by slots."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return _Slot(len(tensors) - 1)
    if isinstance(value, (list, tuple)) and any(isinstance(v, (torch.Tensor, list, tuple)) for v in value):
        return type(value)(_flatten(v, tensors) for v in value)
    return value


def _fill(template, values):
    if isinstance(template, _Slot):
        return values[template.index]
    if isinstance(template, (list, tuple)):
        return type(template)(_fill(v, values) for v in template)
    return template


def _key_of(template, tensors):
    """A hashable description of the call's arguments, or None if a value is unhashable."""
    def key(v):
        if isinstance(v, _Slot):
            t = tensors[v.index]
            return ("T", tuple(int(s) for s in t.shape), t.dtype)
        if isinstance(v, (list, tuple)):
            return (type(v).__name__,) + tuple(key(x) for x in v)
        hash(v)
        return (type(v), v)
    try:
        return key(template)
    except TypeError:
        return None


# ---------------------------------------------------------------------------
# output records (the per-signature "compile" step)

class _Ref:
    """A leaf of a recorded return value: output i, input i, or a constant."""

    __slots__ = ("kind", "value")

    def __init__(self, kind, value):
        self.kind, self.value = kind, value


class _Record:
    """What a kernel allocates in shared_hbm and returns, for one signature."""

    __slots__ = ("outputs", "result")

    def __init__(self, outputs, result):
        self.outputs = outputs   # [(shape, np dtype)] in allocation order
        self.result = result     # the return value with _Ref leaves


_records: dict = {}
_records_lock = threading.Lock()
_stats = {"hits": 0, "traces": 0}


def clear_signature_cache():
    """Forget every recorded kernel signature (the next calls trace again)."""
    with _records_lock:
        _records.clear()


def signature_cache_info():
    """``{'signatures': n, 'hits': n, 'traces': n}`` for the output records."""
    return {"signatures": len(_records), **_stats}


def _trace(kernel: Kernel, grid, args_t, kwargs_t, inputs, make_output=None) -> _Record:
    """Run the kernel on host arrays ``inputs`` and record its outputs.

    The shape trace passes zero-filled inputs and NumPy outputs; a CPU call
    passes views of the tensors and ``make_output`` creating torch tensors.
    """
    outputs = []

    def allocate(shape, np_dtype):
        arr = make_output(shape, np_dtype) if make_output is not None else np.zeros(shape, dtype=np_dtype)
        outputs.append(arr)
        return arr

    result = run_on_host_buffers(kernel.fn, grid, _fill(args_t, inputs), _fill(kwargs_t, inputs),
                                 hbm_allocator=allocate, target=kernel.target,
                                 debug=kernel.debug if make_output is not None else False,
                                 kernel_name=kernel.fn.__name__, cache=kernel._traces)
    by_id = {id(a): _Ref("out", i) for i, a in enumerate(outputs)}
    by_id.update({id(a): _Ref("in", i) for i, a in enumerate(inputs)})

    def template(v):
        if isinstance(v, np.ndarray):
            if id(v) not in by_id:
                raise NKIError(f"kernel {kernel.fn.__name__} returns part of a tensor (or a strided input); on "
                               "torch tensors a kernel must return whole shared_hbm tensors or contiguous inputs",
                               location="<kernel return>")
            return by_id[id(v)]
        if isinstance(v, (tuple, list)):
            return type(v)(template(x) for x in v)
        if isinstance(v, dict):
            return {k: template(x) for k, x in v.items()}
        return _Ref("const", v)

    return _Record([(tuple(a.shape), a.dtype) for a in outputs], template(result))


def _signature(kernel, grid, args_t, kwargs_t, tensors):
    sig = _key_of((args_t, tuple(sorted(kwargs_t.items()))), tensors)
    return None if sig is None else (kernel.fn, grid, kernel.target, kernel.debug, sig)


def _remember(key, rec):
    _stats["traces"] += 1
    if key is not None:
        with _records_lock:
            _records[key] = rec


def _recorded(key):
    rec = _records.get(key) if key is not None else None
    if rec is not None:
        _stats["hits"] += 1
    return rec


def _record_for(kernel: Kernel, grid, args_t, kwargs_t, tensors) -> _Record:
    """The output record of this signature: cached, or made by a shape trace."""
    key = _signature(kernel, grid, args_t, kwargs_t, tensors)
    rec = _recorded(key)
    if rec is None:
        rec = _trace(kernel, grid, args_t, kwargs_t, zero_inputs(tensors))
        _remember(key, rec)
    return rec


def _build_result(template, outs, ins):
    if isinstance(template, _Ref):
        return outs[template.value] if template.kind == "out" else ins[template.value] \
            if template.kind == "in" else template.value
    if isinstance(template, (tuple, list)):
        return type(template)(_build_result(x, outs, ins) for x in template)
    if isinstance(template, dict):
        return {k: _build_result(x, outs, ins) for k, x in template.items()}
    return template


# ---------------------------------------------------------------------------
# execution on host memory (CPU tensors, or device memory aliases in a task)

def _execute(launch, outs, ins):
    kernel, grid, args_t, kwargs_t, record = launch
    arrays = [host_view(t) for t in ins]
    out_arrays = [host_view(t) for t in outs]
    it = iter(range(len(out_arrays)))
    name = kernel.fn.__name__

    def allocate(shape, np_dtype):
        i = next(it, None)
        if i is None or tuple(shape) != tuple(record.outputs[i][0]) or np.dtype(np_dtype) != record.outputs[i][1]:
            raise NKIError(f"kernel {name} allocated a shared_hbm tensor {tuple(shape)} {np.dtype(np_dtype).name} "
                           "that its recorded signature does not have (outputs must depend only on shapes, "
                           "dtypes and non-tensor arguments)")
        return out_arrays[i]

    run_on_host_buffers(kernel.fn, grid, _fill(args_t, arrays), _fill(kwargs_t, arrays), hbm_allocator=allocate,
                        target=kernel.target, debug=kernel.debug, kernel_name=name, cache=kernel._traces)


# ---------------------------------------------------------------------------
# the adapter registered with nki.jit

def _is_symbolic(t: torch.Tensor) -> bool:
    if t.device.type == "meta":
        return True
    try:
        from torch._subclasses.fake_tensor import is_fake
        return is_fake(t)
    except ImportError:  # pragma: no cover
        return False


class TorchAdapter:
    """Runs ``@nki.jit`` kernels called with torch tensors."""

    @staticmethod
    def accepts(args, kwargs):
        tensors = []
        _flatten((tuple(args), tuple(kwargs.values())), tensors)
        return bool(tensors)

    @staticmethod
    def launch(kernel: Kernel, grid, args, kwargs):
        tensors = []
        args_t = _flatten(tuple(args), tensors)
        kwargs_t = {k: _flatten(v, tensors) for k, v in kwargs.items()}
        outs, record = _launch_flat(kernel, tuple(grid), args_t, kwargs_t, tensors)
        return _build_result(record.result, outs, tensors)


#: Called with (kernel, grid, args_t, kwargs_t, tensors) at each launch on the device, before
#: the task is queued: the Trainium twin (torchneuron.target) charges the kernel there.
launch_observer = None


def zero_inputs(tensors) -> list:
    """Zero-filled host arrays shaped as ``tensors``, as a shape trace runs the kernel on."""
    return [np.zeros(tuple(int(s) for s in t.shape), dtype=_np_dtype(t)) for t in tensors]


def arguments(args_t, kwargs_t, inputs):
    """The kernel's arguments with ``inputs`` in the tensors' places."""
    return _fill(args_t, inputs), {k: _fill(v, inputs) for k, v in kwargs_t.items()}


def _device_of(kernel: Kernel, tensors) -> torch.device:
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise RuntimeError(f"NKI kernel {kernel.fn.__name__}: expected all tensors on one device, got "
                           f"{sorted(str(d) for d in devices)}")
    return next(iter(devices))


def _launch_flat(kernel: Kernel, grid, args_t, kwargs_t, tensors):
    """Launch on the flattened call; returns the new ``shared_hbm`` outputs and the record."""
    name = kernel.fn.__name__
    device = _device_of(kernel, tensors)
    symbolic = any(_is_symbolic(t) for t in tensors)
    if device.type == "cpu" and not symbolic:
        return _run_on_host(kernel, grid, args_t, kwargs_t, tensors)
    record = _record_for(kernel, grid, args_t, kwargs_t, tensors)
    outs = [torch.empty(shape, dtype=_torch_dtype(d, name), device=device) for shape, d in record.outputs]
    if not symbolic and launch_observer is not None:
        launch_observer(kernel, grid, args_t, kwargs_t, tensors)
    if not symbolic:
        launch = (kernel, grid, args_t, kwargs_t, record)
        k = len(outs)
        python_task(f"nki::{name}", outs + [t.detach() for t in tensors],
                    lambda host: _execute(launch, host[:k], host[k:]))
    return outs, record


def _run_on_host(kernel, grid, args_t, kwargs_t, tensors):
    """CPU tensors: run now, on views of their memory (recording the signature on the way)."""
    key = _signature(kernel, grid, args_t, kwargs_t, tensors)
    record = _recorded(key)
    name = kernel.fn.__name__
    if record is not None:
        outs = [torch.empty(shape, dtype=_torch_dtype(d, name)) for shape, d in record.outputs]
        _execute((kernel, grid, args_t, kwargs_t, record), outs, tensors)
        return outs, record
    outs = []

    def make_output(shape, np_dtype):
        outs.append(torch.empty(tuple(shape), dtype=_torch_dtype(np_dtype, name)))
        return host_view(outs[-1])

    record = _trace(kernel, grid, args_t, kwargs_t, [host_view(t) for t in tensors], make_output)
    _remember(key, record)
    return outs, record


register_adapter(TorchAdapter)
# a direct kernel call in a compiled region runs eagerly (a graph break); nki_op makes it a graph node
_torch_patches.apply("nki-kernel-dynamo-disable", Kernel)


# ---------------------------------------------------------------------------
# nki_op: a kernel as a PyTorch custom operator

def nki_op(name, fn=None, /, *, mutates_args=(), schema=None, device_types=None, fake=None,
           backward=None, setup_context=None):
    """Register an NKI kernel (or a typed function calling kernels) as a PyTorch custom operator.

    ``fn`` is either an ``@nki.jit`` kernel (optionally with a grid,
    ``kernel[2, 2]``) whose parameters carry torch type annotations, or a
    plain function with torch type annotations that calls kernels.  ``schema``
    (e.g. ``"(Tensor a, Tensor b) -> Tensor"``) replaces the annotations.
    ``mutates_args`` names the arguments the kernel stores into, as for
    ``torch.library.custom_op``.

    The fake (meta) implementation is ``fake`` if given; otherwise it is the
    operator itself run on fake tensors, whose kernel calls return empty
    tensors of the shapes the kernel's recorded signature gives (traced once
    per signature, nothing runs).  ``backward``/``setup_context`` are passed
    to ``register_autograd``; the returned ``CustomOpDef`` also has
    ``register_autograd``, ``register_fake`` and ``register_kernel``.

    Usable as ``@nki_op("ns::name")`` (above ``@nki.jit`` or a typed
    function) or as ``nki_op("ns::name", kernel)``.
    """
    def register(fn):
        if isinstance(fn, Kernel):
            kernel = fn
            sig_fn = kernel.fn

            @functools.wraps(sig_fn)
            def impl(*args, **kwargs):
                return kernel(*args, **kwargs)
        else:
            sig_fn = impl = fn
        op_schema = schema
        if op_schema is None:
            op_schema = torch.library.infer_schema(sig_fn, mutates_args=mutates_args)
        op = torch.library.custom_op(name, impl, mutates_args=mutates_args, device_types=device_types,
                                     schema=op_schema)
        op.register_fake(fake if fake is not None else impl)
        if backward is not None:
            op.register_autograd(backward, setup_context=setup_context)
        return op

    if fn is not None:
        return register(fn)
    return register
