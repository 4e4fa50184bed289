"""Fused causal self-attention forward in NKI, run on `neuron` tensors.

    PYTHONPATH=. python examples/nki_attention.py [--heads 4] [--seq 512] [--dhead 64] [--dtype bfloat16]

One kernel computes softmax(Q K^T / sqrt(d) + causal mask) V per head: the
scores of a block of 128 queries stay on chip (PSUM, then SBUF), the
row softmax is fused with the exponential, and P V accumulates in PSUM.
The kernel is called directly on neuron tensors (one device task on the
current stream) and through `nki_op` as a PyTorch operator (also inside
torch.compile), and checked against PyTorch's scaled_dot_product_attention.
"""
import argparse
import time

import numpy as np
import torch

import torchneuron  # noqa: F401  (registers the neuron device)
import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


@nki.jit
def causal_attention(q, k, v):
    """q, k, v: (heads, seq, d) with seq a multiple of 128 up to 512, d <= 128."""
    heads, seq, d = q.shape
    out = nl.ndarray((heads, seq, d), dtype=q.dtype, buffer=nl.shared_hbm)
    scale = 1.0 / float(np.sqrt(d))
    blocks = seq // 128
    for h in nl.affine_range(heads):
        k_t = nl.load_transpose2d(k[h])                                   # (d, seq)
        v_blocks = [nl.load(v[h, j * 128:(j + 1) * 128, :]) for j in range(blocks)]
        for i in nl.affine_range(blocks):
            q_t = nl.load_transpose2d(q[h, i * 128:(i + 1) * 128, :])     # (d, 128)
            scores = nisa.nc_matmul(stationary=q_t, moving=k_t)           # (128, seq), fp32 in PSUM
            row = nl.arange(128)[:, None]
            col = nl.arange(seq)[None, :]
            masked = nisa.affine_select(pred=(i * 128 + row - col >= 0), on_true_tile=scores,
                                        on_false_value=-3.0e38, dtype=nl.float32)
            neg_max = nisa.tensor_reduce(op=np.max, data=masked, axis=1, negate=True, keepdims=True)
            denom = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
            # exp(scale * s - scale * max), summing each row into denom on the way
            p = nisa.activation(op=nl.exp, data=masked, scale=scale, bias=neg_max * scale,
                                reduce_op=np.add, reduce_res=denom, dtype=nl.bfloat16)
            acc = nl.zeros((128, d), dtype=nl.float32, buffer=nl.psum)
            for j in nl.affine_range(i + 1):                               # key blocks after i are masked out
                p_t = nisa.tensor_copy(nisa.nc_transpose(p[:, j * 128:(j + 1) * 128]), dtype=nl.bfloat16)
                acc += nisa.nc_matmul(stationary=p_t, moving=v_blocks[j])
            o = nisa.tensor_scalar(data=acc, op0=np.divide, operand0=denom, dtype=q.dtype)
            nl.store(out[h, i * 128:(i + 1) * 128, :], value=o)
    return out


# The same kernel as a PyTorch operator: typed signature from the schema, fake
# implementation from the kernel's recorded output shapes.
attention_op = nki.nki_op("examples::causal_attention", causal_attention,
                          schema="(Tensor q, Tensor k, Tensor v) -> Tensor")


def reference(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)


def timed(fn, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        torch.neuron.synchronize()
        times.append(time.perf_counter() - start)
    return out, min(times)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--dhead", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    q, k, v = (torch.randn(args.heads, args.seq, args.dhead, dtype=dtype).to("neuron") for _ in range(3))

    start = time.perf_counter()
    out = causal_attention(q, k, v)          # returns at once; the kernel is queued
    launched = time.perf_counter() - start
    torch.neuron.synchronize()
    first = time.perf_counter() - start
    print(f"first call: launch {launched * 1e3:.1f} ms (includes the per-signature shape trace), "
          f"done after {first:.2f} s")

    _, t_kernel = timed(lambda: causal_attention(q, k, v), args.repeat)
    out_op, t_op = timed(lambda: attention_op(q, k, v), args.repeat)
    compiled = torch.compile(lambda a, b, c: attention_op(a, b, c) * 1.0, backend="aot_eager", fullgraph=True)
    out_c, t_c = timed(lambda: compiled(q, k, v), args.repeat)

    ref = reference(q.cpu(), k.cpu(), v.cpu())
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-3
    for name, o in (("kernel", out), ("nki_op", out_op), ("compiled nki_op", out_c)):
        err = (o.cpu().float() - ref).abs().max().item()
        assert err < tol, f"{name}: max abs error {err} >= {tol}"
        print(f"{name:>16}: max abs error vs PyTorch {err:.2e}")

    qc, kc, vc = q.cpu(), k.cpu(), v.cpu()
    _, t_cpu = timed(lambda: reference(qc, kc, vc), args.repeat)
    _, t_torch_dev = timed(lambda: reference(q, k, v), args.repeat)
    print(f"{args.heads} heads x {args.seq} tokens x d={args.dhead} ({args.dtype}), best of {args.repeat}:")
    print(f"  NKI kernel on neuron (emulated)        {t_kernel * 1e3:8.1f} ms")
    print(f"  nki_op on neuron                       {t_op * 1e3:8.1f} ms")
    print(f"  nki_op in torch.compile (aot_eager)    {t_c * 1e3:8.1f} ms")
    print(f"  PyTorch SDPA on neuron (float32)       {t_torch_dev * 1e3:8.1f} ms")
    print(f"  PyTorch SDPA on the CPU (float32)      {t_cpu * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
