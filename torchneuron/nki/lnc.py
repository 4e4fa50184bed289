"""The two physical NeuronCores of a logical NeuronCore (LNC degree 2), and what passes between them.

A launch of grid ``(2,)`` (``kernel[2]``) runs its two instances as the two
physical cores of one logical core: ``nisa.sendrecv`` exchanges tiles
between them and ``nisa.core_barrier`` waits until both have reached it.
Each instance runs in a thread of its own, one at a time: instance 0 runs
until it finishes or must wait for its partner (a tile not yet sent, a
barrier not yet reached), then the partner runs until it finishes or must
wait, and so on.  The order is the same on every run, so results do not
depend on thread timing; two instances that both wait for each other
without either able to proceed are a deadlock, raised as an error that
names both waits.

Other grids run their instances one after another on the calling thread,
as before; communication there is an error (no partner core).
"""
from __future__ import annotations

import collections
import threading

from .errors import NKIError

PAIR = (2,)


class LncDeadlock(NKIError):
    """Both cores of a logical NeuronCore wait for each other."""


class _Aborted(BaseException):
    """Ends a waiting instance whose partner failed (not an error of its own)."""


class Pair:
    """The two cores of one launch: whose turn it is, the tiles in flight, the barrier counts."""

    def __init__(self):
        self.cond = threading.Condition()
        self.turn = 0
        self.done = [False, False]
        self.waiting = [None, None]  # what each instance waits for, for the deadlock message
        self.mail = collections.defaultdict(collections.deque)  # (sender, receiver) -> values
        self.ready = [None, None]  # what would let each waiting instance go on
        self.barriers = [0, 0]
        self.failed = None

    # -- scheduling (called with self.cond held)
    def _pass_turn(self, rank):
        other = 1 - rank
        if not self.done[other]:
            self.turn = other
        self.cond.notify_all()

    def wait_until(self, rank, ready, what):
        """Block instance ``rank`` until ``ready()``, letting the partner run meanwhile."""
        other = 1 - rank
        with self.cond:
            while not ready():
                if self.done[other]:
                    raise LncDeadlock(f"core {rank} waits for {what}, but core {other} has finished")
                if self.waiting[other] is not None and not self.ready[other]():
                    raise LncDeadlock(f"core {rank} waits for {what} while core {other} waits for "
                                      f"{self.waiting[other]}")
                self.waiting[rank], self.ready[rank] = what, ready
                self._pass_turn(rank)
                while self.turn != rank and self.failed is None:
                    self.cond.wait()
                self.waiting[rank] = self.ready[rank] = None
                if self.failed is not None:
                    raise _Aborted()

    # -- instructions
    def send(self, rank, to, values):
        with self.cond:
            self.mail[(rank, to)].append(values)

    def receive(self, rank, frm, what):
        box = self.mail[(frm, rank)]
        self.wait_until(rank, lambda: bool(box), what)
        with self.cond:
            return box.popleft()

    def barrier(self, rank, what):
        with self.cond:
            self.barriers[rank] += 1
            mine = self.barriers[rank]
        self.wait_until(rank, lambda: self.barriers[1 - rank] >= mine, what)


_local = threading.local()


def current_pair():
    """The pair and rank of the instance running on this thread, or (None, None)."""
    return getattr(_local, "pair", None), getattr(_local, "rank", None)


def run_pair(run_instance, points):
    """Run the two instances of an LNC-2 launch (``run_instance(pid)``) as cooperating threads."""
    pair = Pair()
    errors = [None, None]

    def body(rank):
        _local.pair, _local.rank = pair, rank
        try:
            with pair.cond:
                while pair.turn != rank and pair.failed is None:
                    pair.cond.wait()
                if pair.failed is not None:
                    return
            run_instance(points[rank])
        except _Aborted:
            pass
        except BaseException as e:  # re-raised on the launching thread
            errors[rank] = e
            with pair.cond:
                pair.failed = e
        finally:
            _local.pair = _local.rank = None
            with pair.cond:
                pair.done[rank] = True
                pair._pass_turn(rank)

    threads = [threading.Thread(target=body, args=(r,), name=f"nki-lnc-core{r}", daemon=True) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        if e is not None:
            raise e
