"""SBUF/PSUM capacity by liveness: a tile occupies memory from its allocation to its last use.

The compiler allocates on-chip memory by liveness: a tile's space is free
after the last instruction that touches it (or a view of it).  While an
instance is interpreted, every outermost instruction is numbered; each
on-chip buffer remembers the step it was allocated in and the last step that
read or wrote it (``Allocation.born``/``last_use``).  When the instance ends,
a sweep over those intervals finds the first point where the live set of a
memory exceeds its capacity, and raises ``NKILimitError`` naming the
capacity, the tile whose allocation overflowed (its kernel line is the
error's location) and the live tiles with their sizes and lines.

A tile placed by the kernel (``nl.ndarray(..., address=(partition, byte))``)
occupies its byte range of each partition: tiles placed at overlapping ranges
(the rotating buffers of a kernel that manages its own memory) count once,
as the union of the live placed ranges. Their values are not shared here:
each keeps its own storage. Two overlapping placed tiles that are live at
the same time (each in use, from its first instruction after allocating it to its last, while the other is) would share
bytes on the device, so the emulator's answer could differ from the
device's: that is warned about (``PlacedTilesOverlapWarning``), naming both.

A tile no instruction ever touches after allocating it is live only at its
allocation.  The check runs on interpretation (first call of a signature,
or every call with the trace cache off); replays reuse the recorded verdict.
"""
from __future__ import annotations

import heapq
import os
import sys
import warnings

from . import dtypes as _dt
from .errors import NKILimitError, _PACKAGE_DIR
from .machine import Buffer

_IN_PACKAGE: dict = {}


def kernel_site():
    """(file, line, function) of the innermost frame outside this package (cheap form of errors.kernel_location)."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        inside = _IN_PACKAGE.get(code)
        if inside is None:
            inside = _IN_PACKAGE[code] = os.path.abspath(code.co_filename).startswith(_PACKAGE_DIR + os.sep)
        if not inside:
            return (code.co_filename, frame.f_lineno, code.co_name)
        frame = frame.f_back
    return ("<unknown>", 0, "?")


def format_site(site) -> str:
    if site is None:
        return "<unknown location>"
    return f"{site[0]}:{site[1]} (in {site[2]})"


class Tile:
    """What the capacity check keeps of an on-chip buffer (not its storage, which may be freed)."""

    __slots__ = ("footprint", "born", "first_use", "last_use", "where", "name", "shape", "dtype", "buffer", "address")

    def __init__(self, alloc, footprint, step, where, address=None):
        self.footprint, self.born, self.last_use, self.where = footprint, step, step, where
        self.first_use = None  # the first instruction after its allocation that touches it
        self.address = address  # first byte of a kernel-placed tile in its partitions, else None
        self.name, self.shape, self.dtype, self.buffer = alloc.name, tuple(alloc.data.shape), alloc.dtype, alloc.buffer


class Liveness:
    """Per-instance instruction counter and the on-chip buffers allocated so far."""

    __slots__ = ("machine", "step", "depth", "allocs", "profile", "peak")

    def __init__(self, machine):
        self.machine = machine
        self.step = 0
        self.depth = 0
        self.allocs = []
        # recorder.Recorder collecting instruction records for the performance model, or None
        self.profile = None
        self.peak = {}

    def allocated(self, alloc, footprint, address=None):
        alloc.tile = Tile(alloc, footprint, self.step, kernel_site(), address)
        self.allocs.append(alloc.tile)

    def after(self, fn, args, kwargs, out):
        """An outermost instruction finished: every on-chip buffer it touched is used at this step."""
        step = self.step
        _touch(args, step)
        if kwargs:
            _touch(kwargs.values(), step)
        if out is not None:
            _touch((out,), step)
        if self.profile is not None:
            self.profile.record(fn, args, kwargs, out, step)
        self.step = step + 1

    def check(self):
        """Raise NKILimitError if the live SBUF or PSUM set ever exceeds the capacity."""
        for buffer, cap in ((Buffer.sbuf, self.machine.sbuf_bytes_per_partition),
                            (Buffer.psum, self.machine.psum_bytes_per_partition)):
            allocs = [a for a in self.allocs if a.buffer is buffer and a.footprint]
            self.peak[buffer] = _sweep(allocs, cap, buffer, self.machine)
            _warn_if_placed_tiles_share(allocs, buffer)


# The tile type (tensor.NkiTensor), registered by tensor.py, which builds on this module
# through context.py; until then no value is a tile.
_tile_type = ()


def register_tile_type(cls):
    global _tile_type
    _tile_type = cls


def _touch(values, step):
    NkiTensor = _tile_type
    for v in values:
        if isinstance(v, NkiTensor):
            a = v._alloc
            t = a.tile if a.owner is None else a.owner.tile
            if t is not None:
                t.last_use = step
                if t.first_use is None and step != t.born:
                    t.first_use = step
        elif isinstance(v, (list, tuple)):
            for x in v:
                if isinstance(x, NkiTensor):
                    a = x._alloc
                    t = a.tile if a.owner is None else a.owner.tile
                    if t is not None:
                        t.last_use = step
                        if t.first_use is None and step != t.born:
                            t.first_use = step
                elif isinstance(x, (list, tuple, dict)):
                    _touch((x,), step)
        elif isinstance(v, dict):
            _touch(v.values(), step)


def _sweep(allocs, cap, buffer, machine) -> int:
    """Peak live bytes per partition; raises at the first allocation that goes over ``cap``."""
    allocs.sort(key=lambda a: a.born)
    live = []   # heap of (last_use, index, alloc)
    placed = []  # the live kernel-placed tiles
    automatic = placed_bytes = peak = 0
    for i, a in enumerate(allocs):
        freed_placed = False
        while live and live[0][0] < a.born:
            _, _, dead = heapq.heappop(live)
            if dead.address is None:
                automatic -= dead.footprint
            else:
                placed.remove(dead)
                freed_placed = True
        heapq.heappush(live, (a.last_use, i, a))
        if a.address is None:
            automatic += a.footprint
        else:
            placed.append(a)
        if freed_placed or a.address is not None:
            placed_bytes = _covered_bytes(placed)
        used = automatic + placed_bytes
        if used > cap:
            raise _capacity_error(a, [x[2] for x in live], used, cap, buffer, machine)
        peak = max(peak, used)
    return peak


class PlacedTilesOverlapWarning(UserWarning):
    """Two kernel-placed tiles at overlapping bytes are live together: the device would share them."""


def _warn_if_placed_tiles_share(allocs, buffer) -> None:
    # Used from first to last touch; a tile last used where another is first
    # used hands its bytes over in that instruction (an in-place rotation).
    used = sorted((a for a in allocs if a.address is not None and a.first_use is not None),
                  key=lambda a: a.first_use)
    active = []
    for a in used:
        active = [b for b in active if b.last_use > a.first_use]
        for b in active:
            if a.address < b.address + b.footprint and b.address < a.address + a.footprint:
                warnings.warn(PlacedTilesOverlapWarning(
                    f"{buffer.value.upper()} tiles placed at overlapping bytes are in use together: "
                    f"{_describe(b)} and {_describe(a)}. On the device they share memory; here each "
                    "keeps its own values, so results can differ from the device's"), stacklevel=3)
                return
        active.append(a)


def _covered_bytes(placed) -> int:
    """Bytes per partition in the union of the placed tiles' ranges."""
    total, end = 0, -1
    for start, stop in sorted((t.address, t.address + t.footprint) for t in placed):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def _describe(a) -> str:
    return (f"{a.name or 'tile'} {a.shape} {_dt.name(a.dtype)}: {a.footprint} B/partition, "
            f"allocated at {format_site(a.where)}")


def _capacity_error(a, live, used, cap, buffer, machine):
    mem = buffer.value.upper()
    live = sorted(live, key=lambda x: (-x.footprint, x.born))
    shown = live[:24]
    lines = [f"  {_describe(x)}" for x in shown]
    if len(live) > len(shown):
        rest = sum(x.footprint for x in live[len(shown):])
        lines.append(f"  ... and {len(live) - len(shown)} more tiles, {rest} B/partition")
    total = cap * machine.partitions
    err = NKILimitError(
        f"{mem} capacity ({machine.device} {machine.name}: {total // (1 << 20)} MiB, {cap} bytes per partition)",
        f"{used} bytes per partition", f"{cap} bytes per partition",
        f"the live {mem} set when allocating {a.name or 'a tile'} {a.shape} {_dt.name(a.dtype)}",
        location=format_site(a.where),
        note=f"{len(live)} live {mem} tiles (largest first):\n" + "\n".join(lines))
    err.live_tiles = [{"name": x.name, "shape": x.shape, "dtype": _dt.name(x.dtype),
                       "bytes_per_partition": x.footprint, "location": format_site(x.where)} for x in live]
    err.capacity = cap
    return err
