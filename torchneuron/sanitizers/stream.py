"""The stream sanitizer: finds reads and writes of device memory on different
streams that no event, ``wait_stream`` or synchronisation orders.

On ``neuron`` (as on CUDA) work on different streams runs concurrently, and
a tensor written on one stream and read on another without an event between
them is a data race that no comparison of results reliably finds. The
sanitizer is PyTorch's CUDA stream sanitizer (``torch.cuda._sanitizer``)
carried over to this device, reusing its device-neutral parts: the
happens-before bookkeeping between streams (``StreamSynchronizations``: each
stream's vector of the newest work of every stream it is ordered after,
advanced by event records and waits and by host synchronisations) and the
schema reading of which arguments an operator reads and writes
(``ArgumentHandler``). What it adds:

* accesses are tracked per range of device memory, not per data pointer: a
  race through a view (``x[1:]`` written on one stream, ``x`` read on
  another) is found, and disjoint slices of one tensor do not conflict;
* memory outlives its tensors: when a block is freed, accesses of streams
  that ``record_stream`` did not name are kept, so a block reused by its
  stream's pool while another stream still uses it (a missing
  ``record_stream``) is reported at its new owner's first access;
* synchronisations the dispatcher never sees come from the C++ side
  (csrc/bridge/sanitizers/stream_sanitizer.h: the device guard's event record, wait and
  synchronize, stream and device synchronize, and the allocator's frees),
  and so does work that does not go through the dispatcher: compiled
  graphs' kernels (torchneuron/compile/launch.py calls :func:`_on_kernel`).
  Fused groups and the lean path sit below the dispatcher's Python key, so
  their operators are seen one by one, in stream order, like any other;
  ``mode="reduce-overhead"`` graphs run unreplayed while the sanitizer is on.

A race is reported with both accesses (operator, argument, stream, Python
stack), the tensor's shape and the operator that allocated its storage, as a
:class:`StreamRaceError` (default) or a :class:`StreamRaceWarning`
(race_report.py).

Use ``TORCHNEURON_STREAM_SANITIZER=1`` (``=warn`` to warn) for a whole
program, read when torchneuron is imported, or :func:`stream_sanitizer` as a
context manager. It watches the thread that enabled it, the autograd
engine's threads working for it and every thread started while it is on
(``threading.setprofile`` gives each its own dispatch mode before its first
line); threads that were already running are not seen. docs/sanitizers.md has
the rest.
"""
from __future__ import annotations

import os
import re
import sys
import threading
import warnings
from contextlib import contextmanager

import torch
from torch.cuda._sanitizer import ArgumentHandler, StreamSynchronizations
from torch.utils._python_dispatch import TorchDispatchMode

from .. import _C
from ..compile import launch
from .race_report import RaceReport, StreamRaceError, StreamRaceWarning, _Access, _Storage, _stream_key

__all__ = ["StreamRaceError", "StreamRaceWarning", "StreamSanitizer", "stream_sanitizer", "enable", "disable",
           "active"]

_aten = torch.ops.aten
_gather = torch._C._profiler.gather_traceback

# What the C++ log's kinds are (csrc/bridge/sanitizers/stream_sanitizer.h: sanitizer::Kind).
(_EVENT_RECORD, _EVENT_WAIT, _EVENT_SYNC, _EVENT_DESTROY, _STREAM_SYNC, _DEVICE_SYNC, _FREE, _COLLECTIVE) = range(8)

# Operators that only make storage, without running device work: their
# results are registered (with this allocation site) but not accessed.
_ALLOCATIONS = frozenset({"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
                          "aten::new_empty_strided", "aten::empty_permuted"})
# Operators whose tensor arguments are metadata only, not accesses (the
# schema says so for views; these take a tensor only for its shape and
# dtype), as CUDA's sanitizer reads factory names.
_FACTORY = re.compile(r"(new_.*|.*_like)")
# Operators after which the host has waited for the stream they ran on (a
# value read, a blocking copy to the host, results whose sizes depend on data).
_HOST_WAITS = frozenset({"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::_unique2",
                         "aten::unique_dim", "aten::unique_consecutive", "aten::equal", "aten::is_nonzero"})
# Collectives: c10d's operators (their schemas mark nothing as written) and
# the functional ones DTensor and compiled code call. They run on the
# backend's communication stream, after the caller's queued work; Work.wait()
# orders the caller's stream after them (the backend logs both orders).
_COLLECTIVE_NAMESPACES = ("c10d::", "_c10d_functional::")
# Arguments of c10d's operators that a collective writes (`send` only reads its `tensors`).
_COLLECTIVE_WRITES = frozenset({"tensors", "output_tensors", "output_tensor", "output"})
# Records of freed memory kept at most (oldest dropped first), per sanitizer.
_MAX_FREED = 20000


def _shape(t: torch.Tensor) -> tuple:
    """A tensor's shape for a report; a nested tensor's is its components' shapes."""
    if t.is_nested:
        return tuple(tuple(c) for c in t._nested_tensor_size().tolist())
    return tuple(t.shape)


class _Arguments(ArgumentHandler):
    """CUDA's sanitizer's reading of a schema (what is read, written, an
    output, or metadata only), collecting ranges of neuron memory instead of
    CUDA data pointers: {extent: [written, read, names, is_output, shape,
    dtype, is_input]}."""

    def __init__(self):
        super().__init__()
        self.found: dict = {}

    def _handle_argument(self, value, is_write, metadata_only, name=None, is_output=False):
        if not isinstance(value, torch.Tensor):
            return
        ext = _C._sanitizer_extent(value)
        if ext is None:
            return
        entry = self.found.get(ext)
        if entry is None:
            entry = self.found[ext] = [False, False, [], False, _shape(value), value.dtype, not is_output]
        if is_write:
            entry[0] = True
        elif not metadata_only:
            entry[1] = True
        if name is not None and name not in entry[2]:
            entry[2].append(name)
        if is_output:
            entry[3] = True


class StreamSanitizer:
    """The state of one sanitizer: streams' order, storages, their accesses."""

    def __init__(self, on_race: str = "raise"):
        if on_race not in ("raise", "warn"):
            raise ValueError(f"on_race must be 'raise' or 'warn', not {on_race!r}")
        self.on_race = on_race
        self.syncs = StreamSynchronizations()
        self.seq = 0
        self.storages: dict[tuple[int, int], _Storage] = {}
        self.freed: list[_Access] = []  # accesses to memory freed since, oldest first
        self.reports: list[RaceReport] = []
        self._seen: set = set()  # (earlier access, op) pairs already reported
        self.collective_stream = None  # the stream of the collective logged last
        self.lock = threading.RLock()

    # -- happens-before, from the C++ log ------------------------------------

    def drain(self) -> None:
        log = _C._sanitizer_drain()
        if not log:
            return
        syncs = self.syncs
        synced = False
        for kind, device, stream, ptr, size, used_on in log:
            if kind == _FREE:
                self._free(device, _stream_key(device, stream), ptr, size, used_on)
            elif kind == _EVENT_RECORD:
                syncs.record_state(ptr, _stream_key(device, stream))
            elif kind == _EVENT_WAIT:
                if ptr in syncs.recorded_sync_states:
                    syncs.stream_wait_for_event(_stream_key(device, stream), ptr)
            elif kind == _EVENT_SYNC:
                if ptr in syncs.recorded_sync_states:
                    syncs.all_streams_wait_for_event(ptr)
                    synced = True
            elif kind == _EVENT_DESTROY:
                syncs.recorded_sync_states.pop(ptr, None)
            elif kind == _STREAM_SYNC:
                syncs.all_streams_wait_for_stream(_stream_key(device, stream))
                synced = True
            elif kind == _COLLECTIVE:
                self.collective_stream = _stream_key(device, stream)
            elif kind == _DEVICE_SYNC:
                for key in [k for k in syncs.current_sync_states if k >> 32 == device]:
                    syncs.all_streams_wait_for_stream(key)
                synced = True
        if synced:
            self._prune()

    def host_waited(self, stream: int) -> None:
        self.syncs.all_streams_wait_for_stream(stream)
        self._prune()

    def _ordered_everywhere(self, a: _Access) -> bool:
        """Every stream, and any stream made later, is ordered after `a`."""
        if self.syncs.host_sync_state.get(a.stream, -1) < a.seq:
            return False
        return all(state.get(a.stream, -1) >= a.seq for state in self.syncs.current_sync_states.values())

    def _prune(self) -> None:
        self.freed = [a for a in self.freed if not self._ordered_everywhere(a)]

    def _free(self, device, stream, ptr, size, used_on) -> None:
        st = self.storages.pop((device, ptr), None)
        if st is None:
            return
        # The allocator reuses the block once the record_stream streams have
        # reached this point: their accesses are over. Others' may not be.
        recorded = {_stream_key(device, s) for s in used_on}
        self.freed.extend(a for a in st.accesses if a.stream not in recorded and not self._ordered_everywhere(a))
        if len(self.freed) > _MAX_FREED:
            del self.freed[:len(self.freed) - _MAX_FREED]

    # -- accesses -------------------------------------------------------------

    def _storage(self, ext, shape, dtype, op, stack) -> _Storage:
        """The storage at `ext`; `op` made it if given (else it is not known)."""
        device, base, nbytes = ext[0], ext[1], ext[2]
        st = self.storages.get((device, base))
        if st is None:
            st = self.storages[(device, base)] = _Storage(device, base, nbytes, op, op and stack, shape, dtype)
            end = base + nbytes
            if self.freed:  # memory freed by earlier tensors: their accesses carry over
                kept = []
                for a in self.freed:
                    if a.owner.device == device and a.lo < end and base < a.hi:
                        st.accesses.append(a)
                        if a.lo < base or a.hi > end:
                            kept.append(a)
                    else:
                        kept.append(a)
                self.freed = kept
        return st

    def launch(self, op: str, stream: int, found: dict, waits_for=(), allocation: bool = False,
               host_waits: bool = False) -> None:
        """Operator `op` ran on `stream` with the accesses `found`
        (_Arguments.found); an `allocation` only makes its results; after
        one that `host_waits`, the host has waited for the stream."""
        syncs = self.syncs
        for other in waits_for:  # cross-device copies: the runtime orders them by an event
            syncs._ensure_stream_exists(other)
            syncs._ensure_stream_exists(stream)
            syncs._state_wait_for_other(syncs.current_sync_states[stream], syncs.current_sync_states[other])
        self.seq += 1
        seq = self.seq
        syncs.update_seq_num(stream, seq)
        state = syncs.current_sync_states[stream]
        stack = _gather(True, False, False)
        reports = []
        for ext, (written, read, names, is_output, shape, dtype, is_input) in found.items():
            st = self._storage(ext, shape, dtype, op if is_output and not is_input else None, stack)
            if allocation or not (written or read):
                continue
            lo, hi = ext[3], ext[4]
            now = _Access(written, seq, stream, op, names, is_output, stack, lo, hi, shape, st)
            kept = []
            for a in st.accesses:
                overlaps = a.lo < hi and lo < a.hi
                if overlaps and (written or a.write) and a.stream != stream and state.get(a.stream, -1) < a.seq:
                    reports.append(RaceReport(now, a, st))
                # Superseded: a write covering it (checked above), or an
                # earlier read of this stream within this read.
                if overlaps and lo <= a.lo and a.hi <= hi and (written or (not a.write and a.stream == stream)):
                    continue
                kept.append(a)
            kept.append(now)
            st.accesses = kept
        for other in waits_for:  # ... and the other devices' streams wait for the copy (copy.cpp)
            syncs._state_wait_for_other(syncs.current_sync_states[other], state)
        if host_waits:
            self.host_waited(stream)
        if reports:
            self._report(reports)

    def _report(self, reports) -> None:
        fresh = []
        for r in reports:
            key = (r.previous, r.current.op, r.current.stream)
            if key not in self._seen:
                self._seen.add(key)
                fresh.append(r)
        if not fresh:
            return
        self.reports.extend(fresh)
        if self.on_race == "raise":
            raise StreamRaceError(fresh)
        for r in fresh:
            warnings.warn(str(r), StreamRaceWarning, stacklevel=4)


def _op_stream(found: dict):
    """The stream an operator ran on: the current stream of the device of
    what it writes (else of what it reads), and the streams of other devices
    it reads from (cross-device copies wait for those)."""
    device = None
    for ext, entry in found.items():
        if entry[0] or entry[3]:
            device = ext[0]
            break
    if device is None:
        if not found:
            return None, ()
        device = next(iter(found))[0]
    others = {ext[0] for ext in found if ext[0] != device}
    return (_stream_key(device, _C._sanitizer_current_stream(device)),
            tuple(_stream_key(d, _C._sanitizer_current_stream(d)) for d in others))


def _is_zero_tensor(a) -> bool:
    return isinstance(a, torch.Tensor) and a._is_zerotensor()


def _materialize_zero_tensors(args: tuple) -> tuple | None:
    """`args` with each efficient zero tensor (autograd's storage-less zero
    gradients, sgn's for one) replaced by real zeros. Under any Python
    dispatch mode, PyTorch 2.13 passes such a tensor on to kernels that read
    its null data: ``torch.ops.aten.mul.Scalar(torch._efficientzerotensor(5),
    2.0)`` in a mode ends the process (tests/test_sanitizer.py notices when
    that is fixed). The values are the same; the result is not a zero tensor.
    None when there is none (the common case: nothing is rebuilt)."""
    if not any(_is_zero_tensor(a) or (isinstance(a, (list, tuple)) and any(map(_is_zero_tensor, a))) for a in args):
        return None

    def real(a):
        return torch.zeros(a.shape, dtype=a.dtype, device=a.device) if _is_zero_tensor(a) else a
    return tuple([real(x) for x in a] if isinstance(a, (list, tuple)) else real(a) for a in args)


class _Mode(TorchDispatchMode):
    """The dispatch mode through which the sanitizer sees operators."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Off while torch.compile compiles, on while compiled code runs (its
        # extern kernels are operators, its generated kernels come through
        # compile/launch.py): graphs stay compiled under the sanitizer.
        return True

    def __init__(self, sanitizer: StreamSanitizer):
        super().__init__()
        self.sanitizer = sanitizer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.sanitizer is not _active:  # a thread's mode outlives its sanitizer
            return func(*args, **kwargs)
        schema = func._schema
        name = schema.name
        if func is _aten.record_stream.default or (
                name == "torchneuron::launch_python_task" and str(args[1]).startswith("compiled::")):
            # record_stream: the allocator reports it with the free;
            # compiled kernels were reported by the launcher, precisely.
            return func(*args, **kwargs)
        args = _materialize_zero_tensors(args) or args
        if kwargs and (values := _materialize_zero_tensors(tuple(kwargs.values()))) is not None:
            kwargs = dict(zip(kwargs, values))
        san = self.sanitizer
        factory = bool(_FACTORY.match(name.split("::")[-1]))
        handler = _Arguments()
        with san.lock:
            san.drain()
            handler.parse_inputs(schema, args, kwargs, is_factory=factory)
            early = not schema.returns
            if early:
                # Nothing to allocate: checked before it is queued (a Python
                # task must not see its launch fail after it was queued).
                self._launch(func, args, handler.found)
        if early:
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        with san.lock:
            san.drain()
            # (A factory's result is written, unlike CUDA's sanitizer says: zeros_like fills it.)
            handler.parse_outputs(schema, out, is_factory=False)
            self._launch(func, args, handler.found)
            if handler.found and _is_blocking_copy_to_host(func, args, kwargs):
                san.host_waited(_op_stream(handler.found)[0])
        return out

    def _launch(self, func, args, found) -> None:
        if not found:
            return
        name = func._schema.name
        stream, others = _op_stream(found)
        if name.startswith(_COLLECTIVE_NAMESPACES):
            if self.sanitizer.collective_stream is None:  # not queued by the neuron backend
                return
            stream, others = self.sanitizer.collective_stream, ()
            self.sanitizer.collective_stream = None
            if name.startswith("c10d::") and name != "c10d::send":
                for entry in found.values():
                    entry[0] = entry[0] or any(n in _COLLECTIVE_WRITES for n in entry[2])
        op = str(args[1]) if name == "torchneuron::launch_python_task" else _op_name(func)  # nki::<kernel>
        self.sanitizer.launch(op, stream, found, others, allocation=name in _ALLOCATIONS,
                              host_waits=name in _HOST_WAITS)


def _op_name(func) -> str:
    overload = func._overloadname
    return f"{func._schema.name}" + (f".{overload}" if overload and overload != "default" else "")


def _is_blocking_copy_to_host(func, args, kwargs) -> bool:
    if func is _aten.copy_.default:
        dst, src = args[0], args[1]
        return dst.device.type == "cpu" and src.device.type == "neuron" and not (
            (args[2] if len(args) > 2 else kwargs.get("non_blocking", False)) and dst.is_pinned())
    if func is _aten._to_copy.default:
        dev = kwargs.get("device")
        return args[0].device.type == "neuron" and dev is not None and torch.device(dev).type == "cpu" and not (
            kwargs.get("non_blocking", False) and kwargs.get("pin_memory", False))
    return False


# -- kernels that bypass the dispatcher (torchneuron/compile/launch.py) -------

_PARAMS = re.compile(r'extern\s+"C"\s+void\s+kernel\s*\(([^)]*)\)', re.S)
_kernel_writes: dict = {}


def _written_params(kernel) -> list[bool] | None:
    """Per parameter of an Inductor C++ kernel, whether it may write through
    it: a pointer not declared const (Inductor declares its inputs
    ``const T*``, its outputs and in-place buffers ``T*``). Read from the
    kernel's source beside its shared object; None if not found."""
    if kernel in _kernel_writes:
        return _kernel_writes[kernel]
    written = None
    path = getattr(getattr(kernel, "__self__", None), "__file__", None)
    if path and path.endswith(".so"):
        try:
            with open(path[:-3] + ".cpp") as f:
                m = _PARAMS.search(f.read())
        except OSError:
            m = None
        if m:
            params = [p.strip() for p in m.group(1).split(",") if p.strip()]
            written = ["*" in p and not re.match(r"const\b", p) for p in params]
    _kernel_writes[kernel] = written
    return written


def _on_kernel(kernel, name: str, args) -> None:
    """A compiled kernel is being queued on the current stream (launch.py)."""
    san = _active
    if san is None:
        return
    written = _written_params(kernel)
    found: dict = {}
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor):
            continue
        ext = _C._sanitizer_extent(a)
        if ext is None:
            continue
        w = written[i] if written is not None and i < len(written) else True  # unknown: say written
        entry = found.setdefault(ext, [False, False, [], False, _shape(a), a.dtype, True])
        entry[0 if w else 1] = True
        entry[2].append(f"#{i}")
    if found:
        with san.lock:
            san.drain()
            stream, others = _op_stream(found)
            san.launch(f"compiled::{name}", stream, found, others)


# -- switching on and off -----------------------------------------------------

_active: StreamSanitizer | None = None
_mode: _Mode | None = None
_previous_thread_profile = None  # threading's profile hook before the sanitizer's
_thread_mode = threading.local()


class _ThreadMode:
    """A mode entered for the rest of a thread's life (inert once its sanitizer is off), left when
    the thread ends: its thread-local slot is cleared then, on the thread, with the GIL held. A
    mode left on a thread's stack would be released by C++'s thread-local destructors, which take
    the GIL and abort the process if the interpreter is exiting meanwhile."""

    def __init__(self, san: StreamSanitizer):
        self.mode = _Mode(san)
        self.mode.__enter__()

    def __del__(self):
        self.mode.__exit__(None, None, None)


def _watch_new_threads(san: StreamSanitizer) -> None:
    """Threads started from now on enter a mode of `san` before their first line, then hand the
    profile hook back to whatever threading had (a profiler's, or none)."""
    global _previous_thread_profile
    previous = _previous_thread_profile = threading.getprofile()

    def hook(frame, event, arg):
        sys.setprofile(previous)
        if _active is san:
            _thread_mode.entered = _ThreadMode(san)
        if previous is not None:
            previous(frame, event, arg)

    threading.setprofile(hook)


def active() -> StreamSanitizer | None:
    """The running sanitizer, or None."""
    return _active


def enable(on_race: str = "raise") -> StreamSanitizer:
    """Starts a sanitizer on this thread and the threads started from now on (``on_race``: "raise"
    or "warn") and returns it."""
    global _active, _mode
    if _active is not None:
        raise RuntimeError("the stream sanitizer is already on")
    san = StreamSanitizer(on_race)
    _C._sanitizer_log(True)
    _active, _mode = san, _Mode(san)
    launch.observer = _on_kernel
    _mode.__enter__()
    _watch_new_threads(san)
    return san


def disable() -> StreamSanitizer | None:
    """Stops the sanitizer; returns it (its ``reports`` stay readable)."""
    global _active, _mode
    san, mode = _active, _mode
    if san is None:
        return None
    launch.observer = None
    threading.setprofile(_previous_thread_profile)
    mode.__exit__(None, None, None)
    _C._sanitizer_log(False)
    _active = _mode = None
    return san


@contextmanager
def stream_sanitizer(on_race: str = "raise"):
    """``with stream_sanitizer() as san:`` checks the work in the block;
    ``san.reports`` lists the races found (with ``on_race="warn"`` they are
    warned about instead of raised)."""
    san = enable(on_race)
    try:
        yield san
    finally:
        disable()


def _enable_from_environment() -> None:
    value = os.environ.get("TORCHNEURON_STREAM_SANITIZER", "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return
    enable("warn" if value == "warn" else "raise")
