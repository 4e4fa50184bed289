"""What the stream sanitizer (stream.py) reports: a race between two accesses of device
memory, each named by operator, argument, stream and Python stack, with the memory's
allocation site; raised as a ``StreamRaceError`` or warned as a ``StreamRaceWarning``."""
from __future__ import annotations

import os

from torch.utils._traceback import CapturedTraceback


class StreamRaceError(RuntimeError):
    """Accesses to the same device memory on different streams that nothing orders."""

    def __init__(self, reports: list["RaceReport"]):
        self.reports = reports
        super().__init__("\n\n".join(str(r) for r in reports))


class StreamRaceWarning(UserWarning):
    pass


def _stream_key(device: int, stream: int) -> int:
    return device << 32 | stream


def _stream_name(key: int) -> str:
    device, stream = key >> 32, key & 0xFFFFFFFF
    return f"stream {stream} of neuron:{device}" + (" (the default stream)" if stream == 0 else "")


_OWN_FILES = (os.path.join("torchneuron", "sanitizers", "stream.py"),
              os.path.join("torch", "utils", "_python_dispatch.py"),
              os.path.join("torch", "_ops.py"), os.path.join("torch", "_compile.py"),
              os.path.join("torch", "_dynamo", "eval_frame.py"), os.path.join("torchneuron", "compile", "launch.py"))


def _format_stack(tb) -> str:
    """The Python stack of a captured traceback, innermost last, without the sanitizer's own frames."""
    if tb is None:
        return "      (not captured)\n"
    frames = [f for f in CapturedTraceback(tb).summary() if not f.filename.endswith(_OWN_FILES)]
    lines = []
    for f in frames[-12:]:
        lines.append(f'      File "{f.filename}", line {f.lineno}, in {f.name}\n')
        if f.line:
            lines.append(f"        {f.line.strip()}\n")
    return "".join(lines) or "      (no Python frames)\n"


class _Storage:
    """Device memory one storage owns, as the sanitizer saw it: where it was
    allocated and the accesses to its bytes that later ones must follow."""
    __slots__ = ("device", "base", "nbytes", "op", "stack", "shape", "dtype", "accesses")

    def __init__(self, device, base, nbytes, op, stack, shape, dtype):
        self.device, self.base, self.nbytes = device, base, nbytes
        self.op, self.stack, self.shape, self.dtype = op, stack, shape, dtype
        self.accesses: list[_Access] = []

    def describe(self) -> str:
        if self.op is None:
            return "allocated before the sanitizer started (no allocation site)"
        return (f"allocated as a {tuple(self.shape)} {str(self.dtype).replace('torch.', '')} result of "
                f"{self.op} at\n{_format_stack(self.stack)}")


class _Access:
    """One operator's read or write of bytes [lo, hi) of device memory."""
    __slots__ = ("write", "seq", "stream", "op", "names", "is_output", "stack", "lo", "hi", "shape", "owner")

    def __init__(self, write, seq, stream, op, names, is_output, stack, lo, hi, shape, owner):
        self.write, self.seq, self.stream, self.op = write, seq, stream, op
        self.names, self.is_output, self.stack = names, is_output, stack
        self.lo, self.hi, self.shape, self.owner = lo, hi, shape, owner

    def describe(self) -> str:
        what = "writing" if self.write else "reading"
        args = ", ".join(f"argument '{n}'" for n in self.names)
        if self.is_output:
            args = f"{args} and its result" if args else "its result"
        return (f"{self.op} {what} {args} (a {tuple(self.shape)} tensor) on {_stream_name(self.stream)}, "
                f"launched at\n{_format_stack(self.stack)}")


class RaceReport:
    """A race: the current access, the earlier one it is not ordered after, and the memory."""

    def __init__(self, current: _Access, previous: _Access, storage: _Storage):
        self.current, self.previous, self.storage = current, previous, storage

    @property
    def reused(self) -> bool:
        """The earlier access was to a tensor whose memory was freed and reused since."""
        return self.previous.owner is not self.storage

    def __str__(self) -> str:
        c, p, st = self.current, self.previous, self.storage
        head = (f"neuron stream sanitizer: possible data race on device memory of neuron:{st.device} "
                f"(bytes {c.lo - st.base}..{c.hi - st.base} of a storage of {st.nbytes} bytes)\n")
        lines = [head, f"  This access: {c.describe()}",
                 f"  Earlier access, not ordered before it (no event, wait_stream or synchronize between "
                 f"{_stream_name(p.stream)} and {_stream_name(c.stream)}): {p.describe()}"]
        if self.reused:
            lines.append(
                f"  The earlier access was to another tensor, whose storage was freed while "
                f"{_stream_name(p.stream)} could still use it and then reused by this one (the allocator "
                f"reuses a block on its own stream's order only: a tensor used on another stream needs "
                f"tensor.record_stream(that stream) before it is freed, or a synchronisation). "
                f"That tensor was {p.owner.describe()}")
        lines.append(f"  This tensor's storage was {st.describe()}")
        return "".join(lines)
