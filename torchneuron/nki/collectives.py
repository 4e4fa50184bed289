"""``nki.collectives``: collectives between the ranks of a replica group.

A kernel launch here is one rank (the emulator runs no other ranks alongside
it), so ``rank_id()`` is 0 and a collective over a group of that one rank is
exact: an all-reduce, all-gather, reduce-scatter or all-to-all of one rank
copies its sources into its destinations.  A collective over a group of
several ranks raises ``NKITypeError``: its result depends on ranks that do
not run.  ``ReplicaGroup`` is the upstream helper class.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import isa
from .errors import NKITypeError
from .language import NKIObject


@dataclass
class ReplicaGroup(NKIObject):
    """The ranks a collective runs on, as a list of rank lists (each runs the collective independently)."""

    groups: list = field(default_factory=lambda: [[0]])

    def __post_init__(self):
        self.groups = [[int(r) for r in g] for g in self.groups]
        seen = [r for g in self.groups for r in g]
        if len(seen) != len(set(seen)):
            raise NKITypeError(f"ReplicaGroup: rank lists overlap: {self.groups}")


def rank_id():
    """The rank of this launch: 0 (one rank runs)."""
    return 0


def _single_rank(replica_group, what):
    groups = replica_group.groups if isinstance(replica_group, ReplicaGroup) else replica_group
    mine = [g for g in (groups or [[0]]) if 0 in g]
    if not mine or len(mine[0]) != 1:
        raise NKITypeError(f"nki.collectives.{what}: the replica group {groups} has several ranks; the emulator "
                           f"runs one rank per launch, so only single-rank groups are supported")


def _copy_all(srcs, dsts, what):
    srcs, dsts = list(srcs), list(dsts)
    if len(srcs) != len(dsts):
        raise NKITypeError(f"nki.collectives.{what}: {len(srcs)} sources for {len(dsts)} destinations")
    for s, d in zip(srcs, dsts):
        isa.dma_copy(dst=d, src=s)


def all_reduce(srcs, dsts, replica_group, op=None, **kwargs):
    """All-reduce over ``replica_group`` (one rank: its sources are the result)."""
    _single_rank(replica_group, "all_reduce")
    _copy_all(srcs, dsts, "all_reduce")


def all_gather(srcs, dsts, replica_group, collective_dim=0, **kwargs):
    """All-gather over ``replica_group`` (one rank: its sources are the result)."""
    _single_rank(replica_group, "all_gather")
    _copy_all(srcs, dsts, "all_gather")


def reduce_scatter(srcs, dsts, replica_group, op=None, collective_dim=0, **kwargs):
    """Reduce-scatter over ``replica_group`` (one rank: its sources are the result)."""
    _single_rank(replica_group, "reduce_scatter")
    _copy_all(srcs, dsts, "reduce_scatter")


def all_to_all(srcs, dsts, replica_group, collective_dim=0, **kwargs):
    """All-to-all over ``replica_group`` (one rank: its sources are the result)."""
    _single_rank(replica_group, "all_to_all")
    _copy_all(srcs, dsts, "all_to_all")


def _ring(what):
    def collective(*args, replica_group=None, **kwargs):
        raise NKITypeError(f"nki.collectives.{what}: ring permutes exchange data between ranks; the emulator runs "
                           f"one rank per launch")
    collective.__name__ = what
    return collective


collective_permute = _ring("collective_permute")
collective_permute_implicit = _ring("collective_permute_implicit")
collective_permute_implicit_reduce = _ring("collective_permute_implicit_reduce")


def collective_permute_implicit_current_processing_rank_id(*args, **kwargs):
    """The rank whose data the current ring step processes: this rank (one rank runs)."""
    return 0
