"""The optimisation steps of a tiled matrix multiplication, result = lhsT.T @ rhs, in the NKI 0.x style.

Each step moves less data from HBM per matmul than the one before, the
sequence the NKI matrix-multiplication tutorial walks through:

1. ``basic``: one 128 x 64 x 512 tile, everything loaded once;
2. ``tiled``: every matmul loads its two input tiles;
3. ``hoisted``: the stationary tiles of a row block are loaded once per row
   block, the moving tiles once per output tile;
4. ``blocked``: row and column blocks of several tiles, loaded once per block
   pair and reused by every matmul of the block;
5. ``optimized``: blocks along the contraction too, partial sums kept in
   PSUM, so blocks can be larger and their DMAs move longer rows.
"""
import numpy as np

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

TM, TK, TN = 128, 128, 512


@nki.jit
def basic(lhsT, rhs):
    k, m = lhsT.shape
    _, n = rhs.shape
    out = nl.ndarray((m, n), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    a = nl.ndarray((k, m), dtype=lhsT.dtype, buffer=nl.sbuf)
    b = nl.ndarray((k, n), dtype=rhs.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=lhsT)
    nisa.dma_copy(dst=b, src=rhs)
    acc = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(acc, a, b)
    res = nl.ndarray((m, n), dtype=out.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out


@nki.jit
def tiled(lhsT, rhs):
    k, m = lhsT.shape
    _, n = rhs.shape
    out = nl.ndarray((m, n), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for i in range(m // TM):
        for j in range(n // TN):
            acc = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
            for kk in range(k // TK):
                a = nl.ndarray((TK, TM), dtype=lhsT.dtype, buffer=nl.sbuf)
                b = nl.ndarray((TK, TN), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=a, src=lhsT[kk * TK:(kk + 1) * TK, i * TM:(i + 1) * TM])
                nisa.dma_copy(dst=b, src=rhs[kk * TK:(kk + 1) * TK, j * TN:(j + 1) * TN])
                nisa.nc_matmul(acc, a, b)
            res = nl.ndarray((TM, TN), dtype=out.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=out[i * TM:(i + 1) * TM, j * TN:(j + 1) * TN], src=res)
    return out


@nki.jit
def hoisted(lhsT, rhs):
    k, m = lhsT.shape
    _, n = rhs.shape
    nk = k // TK
    out = nl.ndarray((m, n), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for i in range(m // TM):
        a = nl.ndarray((TK, nk, TM), dtype=lhsT.dtype, buffer=nl.sbuf)
        for kk in range(nk):
            nisa.dma_copy(dst=a[:, kk, :], src=lhsT[kk * TK:(kk + 1) * TK, i * TM:(i + 1) * TM])
        for j in range(n // TN):
            b = nl.ndarray((TK, nk, TN), dtype=rhs.dtype, buffer=nl.sbuf)
            for kk in range(nk):
                nisa.dma_copy(dst=b[:, kk, :], src=rhs[kk * TK:(kk + 1) * TK, j * TN:(j + 1) * TN])
            acc = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
            for kk in range(nk):
                nisa.nc_matmul(acc, a[:, kk, :], b[:, kk, :])
            res = nl.ndarray((TM, TN), dtype=out.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=out[i * TM:(i + 1) * TM, j * TN:(j + 1) * TN], src=res)
    return out


@nki.jit
def blocked(lhsT, rhs, block_m=2, block_n=1):
    k, m = lhsT.shape
    _, n = rhs.shape
    nk = k // TK
    bm, bn = block_m * TM, block_n * TN
    out = nl.ndarray((m, n), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for i in range(m // bm):
        a = nl.ndarray((TK, nk, bm), dtype=lhsT.dtype, buffer=nl.sbuf)
        for kk in range(nk):
            nisa.dma_copy(dst=a[:, kk, :], src=lhsT[kk * TK:(kk + 1) * TK, i * bm:(i + 1) * bm])
        for j in range(n // bn):
            b = nl.ndarray((TK, nk, bn), dtype=rhs.dtype, buffer=nl.sbuf)
            for kk in range(nk):
                nisa.dma_copy(dst=b[:, kk, :], src=rhs[kk * TK:(kk + 1) * TK, j * bn:(j + 1) * bn])
            for ii in range(block_m):
                for jj in range(block_n):
                    acc = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
                    for kk in range(nk):
                        nisa.nc_matmul(acc, a[:, kk, ii * TM:(ii + 1) * TM], b[:, kk, jj * TN:(jj + 1) * TN])
                    res = nl.ndarray((TM, TN), dtype=out.dtype, buffer=nl.sbuf)
                    nisa.tensor_copy(dst=res, src=acc)
                    r0, c0 = i * bm + ii * TM, j * bn + jj * TN
                    nisa.dma_copy(dst=out[r0:r0 + TM, c0:c0 + TN], src=res)
    return out


@nki.jit
def optimized(lhsT, rhs, block_m=4, block_n=2, block_k=4):
    """Blocks along all three axes.  An output block's partial sums stay in PSUM (one bank per
    128 x 512 tile, all eight banks) across the contraction blocks, so each lhsT/rhs block is
    loaded once per output block, in DMAs of whole block rows."""
    k, m = lhsT.shape
    _, n = rhs.shape
    bm, bn, bk = block_m * TM, block_n * TN, block_k * TK
    out = nl.ndarray((m, n), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for j in range(n // bn):
        for i in range(m // bm):
            acc = [[nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum) for _ in range(block_n)]
                   for _ in range(block_m)]
            for kb in range(k // bk):
                a = nl.ndarray((TK, block_k, bm), dtype=lhsT.dtype, buffer=nl.sbuf)
                b = nl.ndarray((TK, block_k, bn), dtype=rhs.dtype, buffer=nl.sbuf)
                for kk in range(block_k):
                    r0 = kb * bk + kk * TK
                    nisa.dma_copy(dst=a[:, kk, :], src=lhsT[r0:r0 + TK, i * bm:(i + 1) * bm])
                    nisa.dma_copy(dst=b[:, kk, :], src=rhs[r0:r0 + TK, j * bn:(j + 1) * bn])
                for ii in range(block_m):
                    for jj in range(block_n):
                        for kk in range(block_k):
                            nisa.nc_matmul(acc[ii][jj], a[:, kk, ii * TM:(ii + 1) * TM],
                                           b[:, kk, jj * TN:(jj + 1) * TN])
            for ii in range(block_m):
                res = nl.ndarray((TM, bn), dtype=out.dtype, buffer=nl.sbuf)
                for jj in range(block_n):
                    nisa.tensor_copy(dst=res[:, jj * TN:(jj + 1) * TN], src=acc[ii][jj])
                r0 = i * bm + ii * TM
                nisa.dma_copy(dst=out[r0:r0 + TM, j * bn:(j + 1) * bn], src=res)
    return out


STEPS = [tiled, hoisted, blocked, optimized]
