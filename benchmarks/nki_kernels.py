"""NKI kernels on the emulator: a tiled bf16 matmul and a fused causal attention forward.

Per kernel:
* the performance model's latency on Trainium2 and Trainium3 (``nki.estimate``:
  modelled device time, MFU, MBU, the busiest engine), which is what the
  kernel would take on the chip by the published figures, not a measurement;
* the emulator's first call (interprets the kernel and records its trace) and
  its steady state (replays the trace), on NumPy arrays and on neuron tensors;
  and the steady state with the trace cache off (the kernel interpreted on
  every call), which is what the cache saves;
* the same computation in PyTorch on the CPU (bf16 and float32);
* a straightforward NumPy interpretation of the kernel: a loop nest with the
  kernel's tiling, its fp32 accumulation and its bf16 roundings, written
  here in plain NumPy.  It does what the emulator does minus the NKI
  machinery (tiles, buffers, checks), so "emulator / NumPy" is the cost of
  that machinery.
The emulator runs its tile GEMMs on the host's matrix unit (AMX) where it
has one, a run of accumulations into one PSUM tile as one pass split between
two threads; float32 tiles on one BLAS thread. The NumPy loop nest
gets the same BLAS setting and does every tile GEMM in float32, so where the
host has AMX the emulator can be faster than it.  PyTorch uses its intra-op
pool.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch
import torch.nn.functional as F

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import ops as nki_ops, torch_bridge
from torchneuron.nki.jit import _limit_blas_to_one_thread

from .common import CPU, NEURON, Config, median, timed

BF16 = ml_dtypes.bfloat16
F32 = np.float32


# -- the kernels ----------------------------------------------------------------------

@nki.jit
def matmul_kernel(lhsT, rhs):
    """result = lhsT.T @ rhs: K x M and K x N inputs, tiles of 128 x 128 x 512, fp32 PSUM."""
    k_dim, m_dim = lhsT.shape
    _, n_dim = rhs.shape
    tm, tk, tn = nl.tile_size.gemm_stationary_fmax, nl.tile_size.pmax, nl.tile_size.gemm_moving_fmax
    result = nl.ndarray((m_dim, n_dim), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(m_dim // tm):
        for n in nl.affine_range(n_dim // tn):
            acc = nl.zeros((tm, tn), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(k_dim // tk):
                a = nl.load(lhsT[k * tk:(k + 1) * tk, m * tm:(m + 1) * tm])
                b = nl.load(rhs[k * tk:(k + 1) * tk, n * tn:(n + 1) * tn])
                acc += nisa.nc_matmul(a, b)
            nl.store(result[m * tm:(m + 1) * tm, n * tn:(n + 1) * tn], value=nl.copy(acc, dtype=result.dtype))
    return result


# The fused causal attention of examples/nki_attention.py (on sys.path via .common).
from nki_attention import causal_attention as attention_kernel  # noqa: E402


# -- the same kernels as plain NumPy loop nests ----------------------------------------

def matmul_numpy(lhsT, rhs):
    k_dim, m_dim = lhsT.shape
    n_dim = rhs.shape[1]
    out = np.empty((m_dim, n_dim), lhsT.dtype)
    for m in range(0, m_dim, 128):
        for n in range(0, n_dim, 512):
            acc = np.zeros((128, 512), F32)
            for k in range(0, k_dim, 128):
                a = lhsT[k:k + 128, m:m + 128].astype(F32)
                b = rhs[k:k + 128, n:n + 512].astype(F32)
                acc += a.T @ b
            out[m:m + 128, n:n + 512] = acc.astype(out.dtype)
    return out


def attention_numpy(q, k, v):
    heads, seq, d = q.shape
    out = np.empty_like(q)
    scale = F32(1.0 / np.sqrt(d))
    for h in range(heads):
        k_t = k[h].T.astype(F32)
        v_blocks = [v[h, j:j + 128].astype(F32) for j in range(0, seq, 128)]
        for i in range(seq // 128):
            s = q[h, i * 128:(i + 1) * 128].astype(F32) @ k_t
            keep = (i * 128 + np.arange(128)[:, None] - np.arange(seq)[None, :]) >= 0
            s = np.where(keep, s, F32(-3.0e38))
            neg_max = -s.max(axis=1, keepdims=True)
            e = np.exp(s * scale + neg_max * scale)
            denom = e.sum(axis=1, keepdims=True)
            p = e.astype(BF16).astype(F32)
            acc = np.zeros((128, d), F32)
            for j in range(i + 1):
                acc += p[:, j * 128:(j + 1) * 128] @ v_blocks[j]
            out[h, i * 128:(i + 1) * 128] = (acc / denom).astype(out.dtype)
    return out


# -- measurements ----------------------------------------------------------------------

def _samples(fn, device, repeats, before=None):
    out = []
    for _ in range(repeats):
        if before is not None:
            before()
        out.append(timed(fn, device))
    return median(out)


def _forget(kernel):
    """Make the next call a first call: no trace, no output record."""
    kernel.cache_clear()
    torch_bridge.clear_signature_cache()


def _measure(kernel, numpy_fn, torch_fns, np_args, cfg: Config, bar) -> dict:
    reps = cfg.repeats
    off = nki.jit(kernel.fn, trace_cache=False)
    dev_args = [torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(NEURON) for a in np_args]
    r = {}
    ref = numpy_fn(*np_args).astype(F32)
    r["max_abs_diff_vs_numpy"] = float(np.abs(kernel(*np_args).astype(F32) - ref).max())
    r["numpy_first_s"] = _samples(lambda: kernel(*np_args), CPU, reps, lambda: _forget(kernel))
    kernel(*np_args)
    r["numpy_replay_s"] = _samples(lambda: kernel(*np_args), CPU, reps)
    off(*np_args)
    r["numpy_interpret_s"] = _samples(lambda: off(*np_args), CPU, reps)
    r["neuron_first_s"] = _samples(lambda: kernel(*dev_args), NEURON, reps, lambda: _forget(kernel))
    kernel(*dev_args)
    r["neuron_replay_s"] = _samples(lambda: kernel(*dev_args), NEURON, reps)
    r["cache_info"] = {k: v for k, v in kernel.cache_info().items() if k != "unreplayable"}
    _limit_blas_to_one_thread()
    numpy_fn(*np_args)
    r["numpy_loop_nest_s"] = _samples(lambda: numpy_fn(*np_args), CPU, reps)
    cpu_args = [t.cpu() for t in dev_args]
    for name, fn in torch_fns.items():
        for dt, label in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
            args = [t.to(dt) for t in cpu_args]
            fn(*args)
            r[f"torch_cpu_{name}_{label}_s"] = _samples(lambda: fn(*args), CPU, reps)
    for machine in ("trn2", "trn3"):
        rep = nki.estimate(kernel, *np_args, machine=machine)
        r[f"model_{machine}"] = {"latency_us": rep.latency_us, "mfu": rep.mfu, "mbu": rep.mbu,
                                 "bottleneck": rep.bottleneck, "instructions": rep.instructions}
    r["replay_over_numpy_loop_nest"] = r["numpy_replay_s"] / r["numpy_loop_nest_s"]
    best_torch = min(v for k, v in r.items() if k.startswith("torch_cpu_") and k.endswith("_s"))
    r["replay_over_torch_cpu"] = r["numpy_replay_s"] / best_torch
    r["interpret_over_replay"] = r["numpy_interpret_s"] / r["numpy_replay_s"]
    r["first_over_replay"] = r["numpy_first_s"] / r["numpy_replay_s"]
    bar.update(1)
    return r


STEPS = 2


def run(cfg: Config, bar) -> dict:
    rng = np.random.default_rng(0)
    m = cfg.pick(1024, 128)
    n = cfg.pick(1024, 512)
    heads, seq, d = cfg.pick((4, 512, 64), (1, 256, 64))
    lhsT = rng.standard_normal((m, m)).astype(BF16)
    rhs = rng.standard_normal((m, n)).astype(BF16)
    out = {"matmul": _measure(matmul_kernel, matmul_numpy, {"matmul": lambda a, b: a.T @ b},
                              [lhsT, rhs], cfg, bar)}
    out["matmul"]["shape"] = f"{m}x{m}x{n} bf16"
    q, k, v = (rng.standard_normal((heads, seq, d)).astype(BF16) for _ in range(3))
    sdpa = {"sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)}
    out["attention"] = _measure(attention_kernel, attention_numpy, sdpa, [q, k, v], cfg, bar)
    out["attention"]["shape"] = f"{heads} heads x {seq} tokens x d={d} bf16, causal"
    for r in out.values():
        r["bf16_tile_gemm"] = "AMX" if nki_ops.BF16_TILE_GEMM else "float32 BLAS"
    return out
