"""``mode="reduce-overhead"``: record a compiled graph's device work once,
then replay it as ONE device task per call (our counterpart of CUDA graphs).

Each graph Inductor compiles (the forward and the backward of a training
step are two graphs) is wrapped in a :class:`ReplayGraph`:

1. warm-up: the first call per signature (the graph's non-tensor arguments,
   i.e. its sizes under dynamic shapes) runs normally;
2. record: the second call runs normally too, while a dispatch mode and the
   kernel launcher (launch.py) write down every piece of device work in order:
   generated C++ kernels with their arguments, and the ATen operators the
   wrapper calls (``mm``, convolutions, fallbacks, copies). Each tensor
   argument is written down as *where its memory lives*: a graph input, a
   buffer the graph allocated, or a tensor from outside (constants);
3. replay: later calls queue one task ``compiled::replay<N>`` that runs the
   recorded steps in C++ (csrc/bridge/python_tasks/compiled_replay.cpp): kernels through
   their C entry points, ATen operators as boxed calls whose argument stacks
   were built at recording, on CPU aliases of device memory. No Python and
   no GIL on the executor thread (except for the rare kernel the C call
   path cannot take, called through its Python binding: launch.py). The
   host does no per-kernel work: it allocates the outputs and queues the task.

Memory, as with CUDA graphs: intermediate buffers are allocated once at
recording and reused by every replay (they stay reserved while the compiled
graph lives). Inputs are used in place, so new input tensors need no copy
into static buffers, and mutations of inputs (optimizer steps, BatchNorm
statistics) land where they should. **Outputs are fresh tensors per call**
(one allocation each), so, unlike CUDA graph outputs, a later replay never
overwrites the results of an earlier one.

A graph that cannot be recorded runs normally from then on, and the reason
is kept in :data:`reasons` (and warned once): random operators (a replay
would repeat the same numbers), data-dependent operators (their sizes or
values reach the host), CPU tensors or host computations inside the graph,
Python device tasks (NKI kernels). A call on another stream than the one
recorded, or with inputs that no longer share memory the way they did when
recorded, runs normally too (counted in ``stats["normal_calls"]``).
"""
from __future__ import annotations

import collections
import functools
import itertools
import warnings
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from .. import _C, _torch_patches
from . import launch as _launch

WARMUP_CALLS = 1      # normal calls per signature before recording
MAX_RECORDINGS = 8    # signatures recorded per graph; more run normally

#: counters: "recordings", "replays", "normal_calls" (calls of a recorded
#: graph that ran normally), "not_recordable" (graphs that cannot be recorded),
#: "binding_steps" (recorded kernels that a replay calls through their Python
#: binding, taking the GIL)
stats: collections.Counter = collections.Counter()
#: graph name -> why it runs without replay
reasons: dict[str, str] = {}

_graph_ids = itertools.count(1)
_aten = torch.ops.aten
_ALLOCATIONS = (_aten.empty_strided.default, _aten.empty.memory_format)
_HOST_STATE_OPS = (_aten.set_, _aten.resize_, _aten.record_stream, _aten._local_scalar_dense, _aten.item)


class NotRecordable(Exception):
    pass


class _Ref:
    """A tensor argument: slot ``slot`` at byte offset ``rel`` from the slot
    tensor's data pointer, with geometry ``geom`` (None: the slot tensor itself)."""
    __slots__ = ("slot", "rel", "geom")

    def __init__(self, slot, rel, geom):
        self.slot, self.rel, self.geom = slot, rel, geom


def _view(h: torch.Tensor, ref: _Ref) -> torch.Tensor:
    if ref.geom is None:
        return h
    size, stride, dtype = ref.geom
    itemsize = torch.empty((), dtype=dtype).element_size()
    offset = (h.storage_offset() * h.element_size() + ref.rel) // itemsize
    return torch.empty(0, dtype=dtype, device=h.device).set_(h.untyped_storage(), offset, size, stride)


class _Slot:
    __slots__ = ("kind", "tensor", "index")

    def __init__(self, kind, tensor, index=None):
        # kind: "input" / "cpu_input" (graph argument `index`), "buffer"
        # (allocated by the graph), "output" (a buffer the graph returns),
        # "external" (neuron memory from outside the graph, e.g. constants)
        self.kind, self.tensor, self.index = kind, tensor, index


class _Step:
    """One recorded piece of device work. ``kind``: "cpp" (a C entry point:
    ``fn`` its address, ``args`` its (integer-class, float) arguments as
    launch.c_args splits them, ``scalars`` = [(integer position, 0-dim CPU
    tensor)] its constant host scalars), "binding" (the Python binding ``fn``
    of a kernel the C call path cannot take: ``args`` its arguments), "op"
    (an ATen operator ``fn`` called with ``args``/``kwargs``). Tensor
    arguments are None in ``args``/``kwargs`` and written down in ``refs`` =
    [(argument, list element or -1, ref)] (for kernels, the argument's
    position: in the integer arguments for "cpp"); ``copies`` = [(return,
    element or -1, ref)]: returns of an operator that are new tensors, copied
    into the memory recorded for them."""
    __slots__ = ("kind", "name", "fn", "args", "kwargs", "refs", "copies", "scalars")

    def __init__(self, kind, name, fn, args, kwargs=None, refs=(), copies=(), scalars=()):
        self.kind, self.name, self.fn, self.args, self.kwargs = kind, name, fn, args, kwargs or {}
        self.refs, self.copies, self.scalars = list(refs), list(copies), list(scalars)


class DeviceWorkRecorder(TorchDispatchMode):
    """Runs a graph call normally and writes down its device work."""

    def __init__(self, args):
        super().__init__()
        self.failed: str | None = None
        self.slots: list[_Slot] = []
        self.by_storage: dict[int, int] = {}
        self.cpu_inputs: dict[int, int] = {}
        self.shared_inputs: list[tuple[int, int]] = []
        self.steps: list[_Step] = []
        self.own_tasks = 0
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                if a.device.type == "neuron":
                    key = a.untyped_storage().data_ptr()
                    if key in self.by_storage:
                        self.shared_inputs.append((self.slots[self.by_storage[key]].index, i))
                    else:
                        self._add("input", a, i)
                elif a.device.type == "cpu":
                    self.cpu_inputs[id(a)] = self._add("cpu_input", a, i)

    def fail(self, reason: str) -> None:
        if self.failed is None:
            self.failed = reason

    def _add(self, kind, t, index=None) -> int:
        self.slots.append(_Slot(kind, t, index))
        if t.device.type == "neuron":
            self.by_storage[t.untyped_storage().data_ptr()] = len(self.slots) - 1
        return len(self.slots) - 1

    def _ref(self, t: torch.Tensor):
        if t.device.type == "cpu":
            s = self.cpu_inputs.get(id(t))
            if s is None:
                if t.dim() == 0:
                    return None   # a host scalar: kept as a constant
                raise NotRecordable(f"a CPU tensor {tuple(t.shape)} is used inside the graph")
        elif t.device.type == "neuron":
            s = self.by_storage.get(t.untyped_storage().data_ptr())
            if s is None:
                s = self._add("external", t)
        else:
            raise NotRecordable(f"a tensor on {t.device} is used inside the graph")
        base = self.slots[s].tensor
        rel = t.data_ptr() - base.data_ptr()
        same = (rel == 0 and t.dtype == base.dtype and t.shape == base.shape and t.stride() == base.stride())
        return _Ref(s, rel, None if same else (tuple(t.shape), tuple(t.stride()), t.dtype))

    def _tensor_arg(self, v, refs, arg, elem):
        """None in the recorded arguments for a tensor the replay fills in."""
        ref = self._ref(v)
        if ref is None:
            return v   # a host scalar, kept as a constant
        refs.append((arg, elem, ref))
        return None

    def _encode(self, arg, v, refs):
        if isinstance(v, torch.Tensor):
            return self._tensor_arg(v, refs, arg, -1)
        if isinstance(v, (list, tuple)) and any(isinstance(e, torch.Tensor) for e in v):
            return [self._tensor_arg(e, refs, arg, j) if isinstance(e, torch.Tensor) else e for j, e in enumerate(v)]
        if isinstance(v, torch.device) and v.type == "neuron":
            return torch.device("cpu")   # factory operators run on host aliases
        return v

    # -- what the graph does ---------------------------------------------------------

    def on_kernel(self, kernel, name, args) -> None:
        self.own_tasks += 1
        if self.failed:
            return
        try:
            if not any(isinstance(a, torch.Tensor) and a.device.type == "neuron" for a in args):
                raise NotRecordable(f"kernel {name} runs on the host (no neuron tensors)")
            fn = _launch.entry_point(kernel)
            refs = []
            template = [self._encode(i, a, refs) for i, a in enumerate(args)]
            c = _launch.c_args(args) if fn else None
            if c is not None:
                # tensors the replay fills in are in refs; those left in the
                # template are constant host scalars
                scalars = [(c.pos[i], v) for i, v in enumerate(template) if isinstance(v, torch.Tensor)]
                self.steps.append(_Step("cpp", name, fn, (c.ints, c.floats), scalars=scalars,
                                        refs=[(c.pos[i], e, r) for i, e, r in refs]))
            else:
                self.steps.append(_Step("binding", name, kernel, template, refs=refs))
        except NotRecordable as e:
            self.fail(str(e))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.failed is None:
            try:
                self._on_op(func, args, kwargs, out)
            except NotRecordable as e:
                self.fail(str(e))
        return out

    def _on_op(self, func, args, kwargs, out) -> None:
        if func is torch.ops.torchneuron.launch_python_task.default:
            if self.own_tasks == 0:
                raise NotRecordable("a Python device task (an NKI kernel?) runs inside the graph")
            self.own_tasks -= 1
            return
        if func in _ALLOCATIONS:
            if isinstance(out, torch.Tensor) and out.device.type == "neuron":
                self._add("buffer", out)
            return
        if func.is_view:
            return   # metadata only: arguments are resolved by memory
        tags = func.tags
        if torch.Tag.nondeterministic_seeded in tags or "inductor_seed" in func.name() \
                or "inductor_rand" in func.name():
            raise NotRecordable(f"random operator {func.name()} (a replay would repeat its numbers)")
        if torch.Tag.dynamic_output_shape in tags or torch.Tag.data_dependent_output in tags \
                or func.overloadpacket in _HOST_STATE_OPS:
            raise NotRecordable(f"data-dependent or host-side operator {func.name()}")
        tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        if not any(t.device.type == "neuron" for t in tensors):
            raise NotRecordable(f"host operator {func.name()} inside the graph")
        refs = []
        names = [a.name for a in func._schema.arguments]
        enc_args = [self._encode(i, a, refs) for i, a in enumerate(args)]
        enc_kwargs = {k: self._encode(names.index(k), v, refs) for k, v in kwargs.items()}
        rets = out if len(func._schema.returns) > 1 else (out,)
        copies = []
        for r, v in enumerate(rets):
            for j, o in ([(-1, v)] if not isinstance(v, (list, tuple)) else enumerate(v)):
                if isinstance(o, torch.Tensor):
                    if o.device.type != "neuron":
                        raise NotRecordable(f"{func.name()} returns a tensor on {o.device}")
                    if o.untyped_storage().data_ptr() not in self.by_storage:   # a new tensor: keep its memory
                        copies.append((r, j, _Ref(self._add("buffer", o), 0, None)))
                elif o is not None:
                    raise NotRecordable(f"{func.name()} returns a host value")
        self.steps.append(_Step("op", func.name(), func, enc_args, enc_kwargs, refs, copies))

    def finish(self, outs, name: str) -> "Recording":
        flat, spec = tree_flatten(outs)
        out_refs = []
        for o in flat:
            if isinstance(o, torch.Tensor):
                if o.device.type != "neuron":
                    raise NotRecordable(f"the graph returns a tensor on {o.device}")
                ref = self._ref(o)
                slot = self.slots[ref.slot]
                if slot.kind == "buffer":
                    slot.kind = "output"
                out_refs.append(ref)
            else:
                out_refs.append(o)
        if not self.steps:
            raise NotRecordable("the graph queues no device work")
        return Recording(self, spec, out_refs, name)


class Recording:
    """The recorded device work of one graph signature, replayed as one task
    (a ``torchneuron._C._CompiledReplay``, csrc/bridge/python_tasks/compiled_replay.cpp)."""

    def __init__(self, rec: DeviceWorkRecorder, out_spec, out_refs, name: str):
        self.name = name
        slots = rec.slots
        # Dynamic slots change per call and reach the task with it (neuron
        # inputs, fresh outputs, CPU inputs, in this order); static ones
        # (buffers, externals) are owned by the replay for its lifetime.
        dyn = [i for kind in ("input", "output", "cpu_input") for i, s in enumerate(slots) if s.kind == kind]
        static = [i for i, s in enumerate(slots) if s.kind in ("buffer", "external")]
        self.slots = slots
        self.pos = {s: (False, k) for k, s in enumerate(dyn)}
        self.pos.update({s: (True, k) for k, s in enumerate(static)})
        self.input_idx = [slots[s].index for s in dyn if slots[s].kind == "input"]
        self.cpu_idx = [slots[s].index for s in dyn if slots[s].kind == "cpu_input"]
        out_geoms = [(list(slots[s].tensor.shape), list(slots[s].tensor.stride()), slots[s].tensor.dtype)
                     for s in dyn if slots[s].kind == "output"]
        self.shared_inputs = rec.shared_inputs
        first = next(t for t in [slots[s].tensor for s in dyn + static] if t.device.type == "neuron")
        self.device = first.device
        # (bound to the current stream, the one recorded on: calls on others run normally)
        self.native = _C._CompiledReplay(f"compiled::replay{name}", self.device.index,
                                         [slots[s].tensor for s in static], out_geoms)
        for step in rec.steps:
            refs = [(a, e, self._where(r)) for a, e, r in step.refs]
            if step.kind == "cpp":
                ints, floats = step.args
                self.native.add_kernel(step.name, step.fn, ints, floats, [(a, r) for a, _, r in refs], step.scalars)
            elif step.kind == "op":
                op, _, overload = step.fn.name().partition(".")
                self.native.add_op(step.name, op, overload, step.args, step.kwargs, refs,
                                   [(j, e, self._where(r)) for j, e, r in step.copies])
            else:
                stats["binding_steps"] += 1
                self.native.add_python(step.name, functools.partial(_call_binding, step.fn, step.args, refs))
        # What the graph returns: tensors come from the C++ launch; other
        # values (rare: a constant) are kept here and merged in per call.
        self.native.set_results([self._where(r) if r.geom is not None else self.pos[r.slot] + (0, [], [], None)
                                 for r in out_refs if isinstance(r, _Ref)])
        self.consts = [(i, r) for i, r in enumerate(out_refs) if not isinstance(r, _Ref)]
        # Inductor's compiled graphs return a flat list: no unflattening per call then
        flat = out_spec.type in (list, tuple) and all(c.is_leaf() for c in out_spec.children())
        self.out_type = out_spec.type if flat else None
        self.out_spec = out_spec
        self.slots = None   # (the static tensors are kept by the replay)

    def _where(self, ref: _Ref):
        """The C++ form of a reference: (is_static, slot, rel, sizes, strides, dtype)."""
        is_static, k = self.pos[ref.slot]
        if ref.geom is None:
            t = self.slots[ref.slot].tensor
            return is_static, k, ref.rel, list(t.shape), list(t.stride()), t.dtype
        size, stride, dtype = ref.geom
        return is_static, k, ref.rel, list(size), list(stride), dtype

    # -- a call ----------------------------------------------------------------------

    def replay(self, args: list) -> Any:
        """Queues the replay; returns the outputs, or None if this call must run normally
        (another stream than the recorded one, inputs that no longer share memory as recorded)."""
        for i, j in self.shared_inputs:
            if args[i].untyped_storage().data_ptr() != args[j].untyped_storage().data_ptr():
                return None
        outs = self.native.launch([args[i] for i in self.input_idx], [args[i] for i in self.cpu_idx])
        if outs is None:
            return None
        args.clear()
        for i, v in self.consts:
            outs.insert(i, v)
        if self.out_type is list:
            return outs
        if self.out_type is tuple:
            return tuple(outs)
        return tree_unflatten(outs, self.out_spec)


def _call_binding(kernel, template, refs, dyn, static) -> None:
    """A kernel step through its Python binding (one the C call path cannot take), on host aliases."""
    call = list(template)
    for pos, _, (is_static, k, rel, size, stride, dtype) in refs:
        base = static[k] if is_static else dyn[k]
        call[pos] = _view(base, _Ref(k, rel, (size, stride, dtype)))
    kernel(*call)


class ReplayGraph:
    """Wraps the boxed callable of one compiled graph (``CompiledFxGraph.current_callable``)."""

    def __init__(self, fn, label: str):
        self.fn = fn
        self.name = f"{next(_graph_ids)}"
        self.label = label
        self.reason: str | None = None
        self.calls: collections.Counter = collections.Counter()
        self.recordings: dict[tuple, Recording] = {}

    def __call__(self, args: list):
        if self.reason is not None or _launch.observer is not None:  # the stream sanitizer sees each kernel
            return self.fn(args)
        try:
            key = tuple(a for a in args if not isinstance(a, torch.Tensor))
            hash(key)
        except TypeError:
            return self.fn(args)
        rec = self.recordings.get(key)
        if rec is not None:
            out = rec.replay(args)
            if out is not None:
                stats["replays"] += 1
                return out
            stats["normal_calls"] += 1
            return self.fn(args)
        self.calls[key] += 1
        if self.calls[key] <= WARMUP_CALLS or len(self.recordings) >= MAX_RECORDINGS:
            return self.fn(args)
        return self._record(key, args)

    def _record(self, key, args: list):
        recorder = DeviceWorkRecorder(args)
        keep = list(args)   # inputs stay alive: no memory reuse during the recording
        _launch._local.recorder = recorder
        try:
            with recorder:
                outs = self.fn(args)
        finally:
            _launch._local.recorder = None
        try:
            if recorder.failed:
                raise NotRecordable(recorder.failed)
            self.recordings[key] = recorder.finish(outs, self.name)
            stats["recordings"] += 1
        except NotRecordable as e:
            self.reason = str(e)
            reasons[f"replay{self.name} ({self.label})"] = self.reason
            stats["not_recordable"] += 1
            warnings.warn(f"torch.compile(backend='neuron', mode='reduce-overhead'): {self.label} runs without "
                          f"replay: {self.reason}")
        del keep
        return outs


def inner_compile(label: str):
    """Inductor's ``compile_fx_inner``, its compiled graphs wrapped for replay."""
    from torch._inductor.compile_fx import compile_fx_inner

    def compile_inner(gm, example_inputs, **kwargs):
        compiled = compile_fx_inner(gm, example_inputs, **kwargs)
        return _torch_patches.apply("inductor-compiled-callable", compiled, lambda fn: ReplayGraph(fn, label))

    return compile_inner
