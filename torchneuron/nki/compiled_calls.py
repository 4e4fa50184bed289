"""Direct kernel calls (``torch_neuronx.wrap_nki``) as one node of a ``torch.compile`` graph.

A kernel launch is not something Dynamo can trace: the kernel's Python runs
on the emulator.  So a wrap_nki call in a compiled region is routed here:

1. ``call`` is a ``torch._dynamo.nonstrict_trace`` function: Dynamo records
   it as one opaque call with the kernel's number (``Kernel.number``), the
   grid and the call's arguments, and does not look inside.  The kernel is
   passed by number because nonstrict_trace takes only pytree values and
   constants, and an ``@nki.jit`` kernel is neither.
2. AOTAutograd runs its body in Python (on fake/functional tensors).  The
   body describes the call's signature (kernel, grid, non-tensor arguments,
   tensor shapes and dtypes), records its ``shared_hbm`` outputs (the shape
   trace of torch_bridge) and which tensors the kernel writes into, files
   that under a string key, and calls ONE operator,
   ``torchneuron_nki::call_o<k>(Tensor[] inputs, str call)``, or
   ``call_o<k>_w(Tensor[] inputs, Tensor(a!)[] mutated, str call)`` for a
   kernel that writes into inputs (k: its outputs).  That operator is
   what the Inductor graph holds: an extern call in the
   wrapper, in program order with the generated kernels.
3. At run time the operator looks the key up and launches the kernel as
   eager code does: one ``nki::<kernel>`` task on the current stream.

Writes into inputs: the tensors the kernel stores into, found by running it
once on the emulator (interpreted, on zeros, at compile time), plus those
whose parameter is annotated ``nt.mutable_tensor``, are passed as the
operator's mutated list, so functionalization and Inductor order them as
in-place updates.  Outputs that are inputs (a kernel returning its argument)
are the input tensors themselves, as in eager code.

Keys carry a token of this process, so Inductor's graph cache, keyed on the
graph that holds them, never matches them in another process; an operator
given a key this process did not make raises, naming it.

There is no autograd, as for eager wrap_nki calls, which record no history:
a call on tensors that require grad while gradients are recorded is
refused at compile time, naming the kernel, rather than compiled into a
graph whose gradients would silently leave the kernel out.
"""
from __future__ import annotations

import inspect
import os
import secrets
import threading

import torch

from .jit import Kernel, kernel_by_number, run_on_host_buffers
from .torch_bridge import (_Slot, _build_result, _device_of, _fill, _flatten, _key_of, _launch_flat, _np_dtype,
                           _record_for)
from .typing import TensorSpec

__all__ = ["call", "compiled_call_info"]

OP_NAME = "torchneuron_nki::call_o<k>"


class _Call:
    """One call signature: the kernel, its grid, the argument templates, the record, the writes."""

    __slots__ = ("kernel", "grid", "args_t", "kwargs_t", "record", "mutated", "read", "n_tensors")

    def __init__(self, kernel, grid, args_t, kwargs_t, record, mutated, n_tensors):
        self.kernel, self.grid, self.args_t, self.kwargs_t = kernel, grid, args_t, kwargs_t
        self.record = record
        self.mutated = tuple(sorted(mutated))
        self.read = tuple(i for i in range(n_tensors) if i not in mutated)
        self.n_tensors = n_tensors

    def tensors(self, inputs, mutated):
        if len(inputs) != len(self.read) or len(mutated) != len(self.mutated):
            raise RuntimeError(f"{OP_NAME} for kernel {self.kernel.fn.__name__}: expected {len(self.read)} "
                               f"inputs and {len(self.mutated)} mutated tensors, got {len(inputs)} and "
                               f"{len(mutated)}")
        out = [None] * self.n_tensors
        for i, t in zip(self.read, inputs):
            out[i] = t
        for i, t in zip(self.mutated, mutated):
            out[i] = t
        return out


_PROCESS_TOKEN = f"{os.getpid():x}-{secrets.token_hex(4)}"
_calls: dict[str, _Call] = {}
_keys: dict = {}
_lock = threading.Lock()


def compiled_call_info() -> dict:
    """``{'signatures': n}``: wrap_nki call signatures compiled in this process."""
    return {"signatures": len(_calls)}


def _is_mutable_annotation(ann) -> bool:
    if isinstance(ann, TensorSpec):
        return ann.mutable
    # a string annotation (``from __future__ import annotations``): nt.mutable_tensor[...]
    return isinstance(ann, str) and "mutable_tensor" in ann


def _slots_in(value, found):
    if isinstance(value, _Slot):
        found.add(value.index)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _slots_in(v, found)


def _declared_mutable(kernel: Kernel, args_t, kwargs_t) -> set:
    """Tensors passed to parameters annotated ``nt.mutable_tensor``."""
    try:
        sig = inspect.signature(kernel.fn)
        bound = sig.bind(*args_t, **kwargs_t)
    except (TypeError, ValueError):
        return set()   # the launch itself reports a call that does not fit the kernel
    found = set()
    for name, value in bound.arguments.items():
        param = sig.parameters[name]
        if _is_mutable_annotation(param.annotation):
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                value = tuple(value.values())
            _slots_in(value, found)
    return found


def _written(kernel: Kernel, grid, args_t, kwargs_t, tensors) -> set:
    """Tensors the kernel stores into: one interpreted run on zeros (which tensors a kernel writes
    is a function of its signature, as its outputs are)."""
    import numpy as np

    arrays = [np.zeros(tuple(int(s) for s in t.shape), dtype=_np_dtype(t)) for t in tensors]
    written = []
    run_on_host_buffers(kernel.fn, grid, _fill(args_t, arrays), _fill(kwargs_t, arrays), target=kernel.target,
                        debug=False, kernel_name=kernel.fn.__name__, written=written)
    ids = {id(a) for a in written}
    return {i for i, a in enumerate(arrays) if id(a) in ids}


def _refuse_aliased_writes(kernel, tensors, mutated):
    for i in mutated:
        for j, t in enumerate(tensors):
            if j != i and (t is tensors[i] or _same_memory(t, tensors[i])):
                raise RuntimeError(
                    f"wrap_nki({kernel.fn.__name__}) in torch.compile: the kernel writes into tensor argument "
                    f"{i}, which shares memory with tensor argument {j}; a compiled graph cannot order those "
                    "accesses. Pass separate tensors, or call the kernel outside the compiled region.")


def _same_memory(a, b) -> bool:
    try:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.data_ptr() != 0
    except Exception:  # fake/functional tensors have no storage to compare; identity was checked
        return False


def _call_for(kernel: Kernel, grid, args_t, kwargs_t, tensors):
    """The key and entry of this call's signature (analysed on first sight)."""
    sig = _key_of((args_t, tuple(sorted(kwargs_t.items()))), tensors)
    if sig is None:
        raise TypeError(f"wrap_nki({kernel.fn.__name__}) in torch.compile: a non-tensor argument is not "
                        "hashable, so the call has no signature to compile")
    full = (kernel.fn, grid, kernel.target, kernel.debug, sig)
    with _lock:
        key = _keys.get(full)
        if key is not None:
            return key, _calls[key]
    record = _record_for(kernel, grid, args_t, kwargs_t, tensors)
    mutated = _declared_mutable(kernel, args_t, kwargs_t) | _written(kernel, grid, args_t, kwargs_t, tensors)
    entry = _Call(kernel, grid, args_t, kwargs_t, record, mutated, len(tensors))
    with _lock:
        key = _keys.get(full)
        if key is None:
            key = f"{kernel.fn.__name__}/{len(_calls)}@{_PROCESS_TOKEN}"
            _keys[full] = key
            _calls[key] = entry
        return key, _calls[key]


def _entry(key: str) -> _Call:
    try:
        return _calls[key]
    except KeyError:
        raise RuntimeError(f"{OP_NAME}: no kernel call {key!r} was compiled in this process (a graph naming "
                           "it comes from another process; compile the function again here)") from None


# The operators: ``call_o<k>(Tensor[] inputs, str call)`` for a kernel making k outputs and writing
# into none of its inputs, ``call_o<k>_w(Tensor[] inputs, Tensor(a!)[] mutated, str call)`` for one
# that writes into ``mutated``; both return k tensors. Functionalization takes a mutable tensor
# list but not a list return, so each output count has its operator (defined on first use); an
# empty mutable list is not lowered by Inductor, hence the functional family.
_lib = torch.library.Library("torchneuron_nki", "FRAGMENT")
_ops: dict = {}


def _run(inputs, *rest):
    *mutated, call = rest
    mutated = list(mutated[0]) if mutated else []
    c = _entry(call)
    outs, _ = _launch_flat(c.kernel, c.grid, c.args_t, c.kwargs_t, c.tensors(list(inputs), mutated))
    return outs[0] if len(outs) == 1 else tuple(outs) if outs else None


def _op_for(n_outputs: int, writes: bool):
    with _lock:
        op = _ops.get((n_outputs, writes))
        if op is None:
            name = f"call_o{n_outputs}" + ("_w" if writes else "")
            returns = "Tensor" if n_outputs == 1 else "(" + ", ".join(["Tensor"] * n_outputs) + ")"
            mutated = "Tensor(a!)[] mutated, " if writes else ""
            _lib.define(f"{name}(Tensor[] inputs, {mutated}str call) -> {returns}")
            # one function for real and fake tensors: on fake ones the launch makes empty outputs
            _lib.impl(name, _run, "CompositeExplicitAutograd")
            torch.library.register_fake(f"torchneuron_nki::{name}", _run, lib=_lib)
            op = _ops[(n_outputs, writes)] = getattr(torch.ops.torchneuron_nki, name).default
        return op


class _Result:
    """A call's return value as the nonstrict function hands it back: Dynamo takes only tensors and
    plain values out of such a function, not None, so the result travels as a pytree node whose
    leaves are its tensors and whose context is the rest (None, constants, the nesting)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _split(v, leaves):
    if isinstance(v, torch.Tensor):
        leaves.append(v)
        return ("tensor",)
    if isinstance(v, (tuple, list)):
        return (type(v).__name__,) + tuple(_split(x, leaves) for x in v)
    if isinstance(v, dict):
        return ("dict", tuple(v)) + tuple(_split(x, leaves) for x in v.values())
    return ("const", v)


def _join(shape, leaves):
    kind = shape[0]
    if kind == "tensor":
        return next(leaves)
    if kind == "const":
        return shape[1]
    if kind == "dict":
        return dict(zip(shape[1], (_join(x, leaves) for x in shape[2:])))
    items = [_join(x, leaves) for x in shape[1:]]
    return tuple(items) if kind == "tuple" else items


def _flatten_result(r: _Result):
    leaves = []
    return leaves, _split(r.value, leaves)


def _unflatten_result(leaves, shape):
    return _Result(_join(shape, iter(leaves)))


torch.utils._pytree.register_pytree_node(_Result, _flatten_result, _unflatten_result)


def call(number: int, grid: tuple, args: tuple, kwargs: dict):
    """A wrap_nki call in a compiled region: kernel ``number`` (``Kernel.number``) on ``grid``."""
    return _traced_call(number, tuple(grid), tuple(args), dict(kwargs)).value


@torch._dynamo.nonstrict_trace
def _traced_call(number: int, grid: tuple, args: tuple, kwargs: dict) -> _Result:
    try:
        kernel = kernel_by_number(number)
    except KeyError:
        raise RuntimeError(f"wrap_nki: kernel number {number} no longer exists") from None
    tensors = []
    args_t = _flatten(tuple(args), tensors)
    kwargs_t = {k: _flatten(v, tensors) for k, v in kwargs.items()}
    if not tensors:
        raise TypeError(f"wrap_nki({kernel.fn.__name__}) in torch.compile: the call has no torch tensor "
                        "arguments")
    _device_of(kernel, tensors)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise RuntimeError(
            f"wrap_nki({kernel.fn.__name__}) in torch.compile: a wrap_nki kernel call has no gradient, and this "
            "graph records gradients through a tensor argument that requires grad. Register the kernel as an "
            "operator with a backward (torchneuron.nki.nki_op(...).register_autograd) to train through it, or "
            "pass tensors that need no gradient (.detach(), or run under torch.no_grad()).")
    key, c = _call_for(kernel, tuple(grid), args_t, kwargs_t, tensors)
    _refuse_aliased_writes(kernel, tensors, c.mutated)
    n = len(c.record.outputs)
    ins = [tensors[i] for i in c.read]
    if c.mutated:
        outs = _op_for(n, True)(ins, [tensors[i] for i in c.mutated], key)
    else:
        outs = _op_for(n, False)(ins, key)
    outs = [outs] if n == 1 else list(outs or ())
    return _Result(_build_result(c.record.result, outs, tensors))
