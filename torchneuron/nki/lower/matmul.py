"""Lowerings of the Tensor Engine's matmuls (``nisa.nc_matmul``, ``nl.matmul``), and
runs of accumulating matmuls into one PSUM tile made one pass (``chain_gemms``)."""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from .. import isa as _isa
from .. import language as _nl
from .. import ops as _ops
from ..errors import NKIError
from ..machine import Buffer
from ..tensor import align_to
from ..trace import View, _GATHER
from .lowerer import Decline, bound, lowering, single_bind, style

F32 = np.float32
_errstate = np.errstate


def _matmul_operands(gs, gm):
    """Getter of a matmul's (stationary, moving) as 2-D arrays, for ``ops.tile_gemm``."""
    staged = _ops.StagedTile

    def operands(V, X):
        s, m = gs(V, X), gm(V, X)
        return (s if isinstance(s, staged) else s.reshape(s.shape[0], -1),
                m if isinstance(m, staged) else m.reshape(m.shape[0], -1))
    return operands


def _matmul_getter(gs, gm):
    gemm, operands = _ops.tile_gemm, _matmul_operands(gs, gm)
    return lambda V, X: gemm(*operands(V, X))


@lowering(_isa.nc_matmul)
def _nc_matmul(lw, step):
    dst, kw = style(step, [("stationary", "T"), ("moving", "T")])
    gs, gm = lw.gemm_operand(kw["stationary"], True), lw.gemm_operand(kw["moving"], False)
    if dst is None:
        return _product(lw, step, gs, gm)
    mm = _matmul_getter(gs, gm)
    if lw.meta[dst.slot][2] is not Buffer.psum:
        raise Decline("nc_matmul dst")
    shape = tuple(lw.shape(dst))
    acc = kw.get("accumulate")
    _, dt, _, _ = lw.meta[dst.slot]
    region = lw.valid_region(dst)
    if (acc is not False and dt is not _dt.tfloat32 and dt == F32 and dst.kind != _GATHER
            and (acc is not None or region.all())):
        # update_in_place
        t = lw.vid(dst)
        lw.touch_storage(dst.slot)
        lw.written(dst)

        def op(V, X, L):
            r = mm(V, X)
            if r.shape != shape:
                r = align_to(r, shape)
            with _errstate(all="ignore"):
                np.add(V[t], r, out=V[t])
        return op
    if acc is False:
        w = lw.writer(dst)

        def op(V, X, L):
            r = mm(V, X)
            w(V, align_to(r, shape))
        return op
    cur, _, _ = lw.value(dst)
    keep = None if acc is not None else region.copy()
    w = lw.writer(dst)
    zero = F32(0)

    def op(V, X, L):
        r = align_to(mm(V, X), shape)
        c = cur(V, X)
        if keep is not None:
            c = np.where(keep, c, zero)
        w(V, c + r)
    return op


@lowering(_nl.matmul)
def _nl_matmul(lw, step):
    a = bound(_nl.matmul, step)
    x, y = a["x"], a["y"]
    if not isinstance(x, View) or not isinstance(y, View):
        raise Decline("matmul operands")
    if a["transpose_x"]:
        gx = lw.gemm_operand(x, True)
    else:
        # nl.transpose(x): a result tile of its own in the interpreter, read back exactly
        g0, _, _ = lw.value(x)

        def gx(V, X):
            return np.ascontiguousarray(g0(V, X).T)
    return _product(lw, step, gx, lw.gemm_operand(y, False))


def _product(lw, step, gs, gm):
    """A matmul whose result is a new PSUM tile. If the next step is ``psum += <it>``,
    that step computes the product into its PSUM tile (``_update`` sets ``taken``)
    and this one only hands it the operands, in the product's slot (per launch):
    this step's frees may release them."""
    put, mm = lw.produce(step), _matmul_getter(gs, gm)
    slot, operands, taken = single_bind(step), _matmul_operands(gs, gm), [False]
    stable = getattr(gs, "stable", False) and getattr(gm, "stable", False)
    lw.product = (lw.step_index, slot, taken, stable)

    def op(V, X, L):
        if taken[0]:
            X[slot] = operands(V, X)
        else:
            put(V, X, mm(V, X))
    op.hands_off = taken  # [True]: it only hands its operands to the next step
    return op


def _inert(op):
    """Whether ``op`` only writes a tile of its own (a load) or hands a matmul's
    operands on (``_product``): a PSUM accumulation may run after it."""
    return op is not None and (getattr(op, "loads", False) or getattr(op, "hands_off", (False,))[0])


def chain_gemms(steps):
    """The closures and kernel lines of ``steps`` [(op, frees, line)], with each
    run of ``psum += nc_matmul(...)`` into one PSUM tile (operands the same for
    the whole launch), separated only by inert steps, made one closure: the
    inert steps in order, then the products added to the tile in order
    (``ops.tile_gemm_chain``). Every element gets the same sums in the same
    order; the tile is read and written once instead of once per product."""
    ops, locs, i = [], [], 0
    while i < len(steps):
        op, frees, loc = steps[i]
        target = getattr(op, "chain", (None,))[0]
        run, j, last = [steps[i]], i + 1, i
        while target is not None and j < len(steps):
            o = steps[j][0]
            if getattr(o, "chain", (None,))[0] == target:
                last = j
            elif not _inert(o):
                break
            run.append(steps[j])
            j += 1
        if last > i:
            ops.append(_chain_op(run[:last - i + 1], target))
            locs.append(loc)
            i = last + 1
            continue
        if op is not None or frees:
            ops.append(_with_frees(op, frees) if frees else op)
            locs.append(loc)
        i += 1
    return ops, locs


def _chain_op(run, target):
    chain = _ops.tile_gemm_chain
    seq = [(getattr(op, "chain", (None, None))[1], op, tuple(frees), loc) for op, frees, loc in run]

    def op(V, X, L):
        pairs = []
        for held, f, frees, loc in seq:
            if held is not None:
                pairs.append(X[held])
            elif f is not None:
                try:
                    f(V, X, L)
                except NKIError as e:
                    e.relocate(loc)
                    e.placed = True
                    raise
            for s in frees:
                X[s] = None
        chain(pairs, V[target])
    return op


def _with_frees(op, frees):
    if op is None:
        def run(V, X, L):
            for s in frees:
                X[s] = None
        return run

    def run(V, X, L):
        op(V, X, L)
        for s in frees:
            X[s] = None
    return run
