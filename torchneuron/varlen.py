"""``torch.nn.attention.varlen`` on ``neuron``: its operators as per-sequence attention.

PyTorch implements ``varlen_attn`` with three custom operators
(``torch_attn::_varlen_attn``, ``_varlen_attn_out``, ``_varlen_attn_backward``)
whose one implementation calls the CUDA flash-attention kernels; the CPU has
none. Here each is registered for ``neuron`` (``torch.library.register_kernel``,
the custom-operator API) as a composite: for every sequence ``i`` of the packed
batch, the CPU's flash kernel ``_scaled_dot_product_flash_attention_for_cpu``
(and its backward), which is the kernel ``scaled_dot_product_attention``
chooses on ``neuron`` as on the CPU, over the rows
``cu_seq_q[i]:cu_seq_q[i+1]`` of the queries and ``cu_seq_k[i]:cu_seq_k[i+1]``
of the keys and values. Autograd is PyTorch's own registration
(``_varlen_attn``'s backward calls ``_varlen_attn_backward``).

Semantics are the flash kernel's: causal and sliding-window masks are aligned
to the bottom right when a sequence has more keys than queries (query ``r`` of
``Lq`` sees key ``c`` of ``Lk`` iff ``r + Lk - Lq - left <= c <= r + Lk - Lq +
right``), ``window_size=(-1, -1)`` is full attention, GQA repeats each key and
value head for its group of query heads, ``seqused_k`` takes the first
``seqused_k[i]`` keys of sequence ``i``. The logsumexp has shape ``(Hq, Tq)``.

The sequence boundaries are data: reading ``cu_seq_q``/``cu_seq_k`` waits for
the work that writes them, as any operator that reads values does; the
attention itself is queued as device operators.
"""
from __future__ import annotations

import torch

_OPS = ("_varlen_attn", "_varlen_attn_out", "_varlen_attn_backward")


def _bounds(cu_seq_q: torch.Tensor, cu_seq_k: torch.Tensor | None, seqused_k: torch.Tensor | None,
            total_q: int, total_k: int) -> list[tuple[int, int, int, int]]:
    """(q0, q1, k0, k1) per sequence, checked against the packed lengths."""
    if cu_seq_k is None:
        raise ValueError("varlen_attn on neuron: cu_seq_k is required (None is only for a paged KV cache, "
                         "with block_table, which neuron does not support)")
    for name, t in (("cu_seq_q", cu_seq_q), ("cu_seq_k", cu_seq_k)):
        if t.dim() != 1 or t.numel() < 1 or t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"varlen_attn: {name} must be a 1-D int32 or int64 tensor of N+1 cumulative "
                             f"positions, got shape {tuple(t.shape)} and dtype {t.dtype}")
    if cu_seq_q.numel() != cu_seq_k.numel():
        raise ValueError(f"varlen_attn: cu_seq_q and cu_seq_k must describe the same number of sequences, "
                         f"got {cu_seq_q.numel() - 1} and {cu_seq_k.numel() - 1}")
    cq, ck = cu_seq_q.tolist(), cu_seq_k.tolist()
    used = None if seqused_k is None else seqused_k.tolist()
    if used is not None and len(used) != len(cq) - 1:
        raise ValueError(f"varlen_attn: seqused_k must have one entry per sequence ({len(cq) - 1}), "
                         f"got {len(used)}")
    for name, c, total in (("cu_seq_q", cq, total_q), ("cu_seq_k", ck, total_k)):
        if c[0] != 0 or any(b < a for a, b in zip(c, c[1:])) or c[-1] > total:
            raise ValueError(f"varlen_attn: {name} must start at 0, not decrease and end within the "
                             f"{total} packed rows, got {c}")
    out = []
    for i in range(len(cq) - 1):
        k1 = ck[i + 1] if used is None else min(ck[i + 1], ck[i] + used[i])
        out.append((cq[i], cq[i + 1], ck[i], k1))
    return out


def _mask(lq: int, lk: int, is_causal: bool, window: list[int] | None, device) -> tuple[bool, torch.Tensor | None]:
    """(is_causal flag, additive float mask or None) for one sequence of ``lq`` queries and ``lk`` keys."""
    left, right = (-1, -1) if window is None else window
    if is_causal:
        right = 0
    if left < 0 and right < 0:
        return False, None
    if left < 0 and right == 0 and lq == lk:
        return True, None  # SDPA's causal mask (top left) is the bottom-right one here
    offset = lk - lq
    r = torch.arange(lq, device=device).unsqueeze(1)
    c = torch.arange(lk, device=device).unsqueeze(0)
    allowed = torch.ones(lq, lk, dtype=torch.bool, device=device)
    if right >= 0:
        allowed &= c <= r + offset + right
    if left >= 0:
        allowed &= c >= r + offset - left
    zero = torch.zeros((), device=device)
    return False, torch.where(allowed, zero, torch.full((), float("-inf"), device=device))


def _heads(query: torch.Tensor, key: torch.Tensor, enable_gqa: bool | None) -> int:
    hq, hk = query.size(1), key.size(1)
    if hq % hk != 0 or (enable_gqa is False and hq != hk):
        raise ValueError(f"varlen_attn: query has {hq} heads and key/value {hk}: they must be equal, or "
                         f"{hq} a multiple of {hk} with enable_gqa=True")
    return hq // hk


def _check(query, key, value, block_table) -> None:
    if block_table is not None:
        raise NotImplementedError("varlen_attn on neuron: block_table (a paged KV cache) is not supported")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dim() != 3:
            raise ValueError(f"varlen_attn: {name} must have shape (total_tokens, heads, head_dim), "
                             f"got {tuple(t.shape)}")


def _as_batch(t: torch.Tensor, rows: slice, groups: int = 1) -> torch.Tensor:
    """Rows of a packed (T, H, D) tensor as SDPA's (1, H, L, D), each head repeated ``groups`` times."""
    t = t[rows].transpose(0, 1)
    if groups > 1:
        t = t.repeat_interleave(groups, dim=0)
    return t.unsqueeze(0)


def _forward(out, query, key, value, cu_seq_q, cu_seq_k, is_causal, scale, window_size, enable_gqa,
             seqused_k, block_table):
    _check(query, key, value, block_table)
    groups = _heads(query, key, enable_gqa)
    lse = torch.empty(query.size(1), query.size(0), dtype=torch.float32, device=query.device)
    for q0, q1, k0, k1 in _bounds(cu_seq_q, cu_seq_k, seqused_k, query.size(0), key.size(0)):
        causal, mask = _mask(q1 - q0, k1 - k0, is_causal, window_size, query.device)
        o, l = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            _as_batch(query, slice(q0, q1)), _as_batch(key, slice(k0, k1), groups),
            _as_batch(value, slice(k0, k1), groups), 0.0, causal, attn_mask=mask, scale=scale)
        out[q0:q1].copy_(o[0].transpose(0, 1))
        lse[:, q0:q1].copy_(l[0])
    return lse


def _varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, scale=None,
                 window_size=None, enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
    out = query.new_empty(query.shape[:-1] + value.shape[-1:])
    lse = _forward(out, query, key, value, cu_seq_q, cu_seq_k, is_causal, scale, window_size, enable_gqa,
                   seqused_k, block_table)
    return out, lse, torch.zeros(2, dtype=torch.uint64, device=query.device)  # no dropout: no RNG state


def _varlen_attn_out(out, query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, scale=None,
                     window_size=None, enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
    return _forward(out, query, key, value, cu_seq_q, cu_seq_k, is_causal, scale, window_size, enable_gqa,
                    seqused_k, block_table)


def _varlen_attn_backward(grad_out, query, key, value, out, lse, cu_seq_q, cu_seq_k, max_q, max_k, is_causal,
                          rng_state, scale=None, window_size=None):
    _check(query, key, value, None)
    groups = _heads(query, key, None)  # the backward is not told enable_gqa: the head counts say it
    dq, dk, dv = torch.empty_like(query), torch.zeros_like(key), torch.zeros_like(value)
    hk = key.size(1)
    for q0, q1, k0, k1 in _bounds(cu_seq_q, cu_seq_k, None, query.size(0), key.size(0)):
        causal, mask = _mask(q1 - q0, k1 - k0, is_causal, window_size, query.device)
        rows_q, rows_k = slice(q0, q1), slice(k0, k1)
        g_q, g_k, g_v = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            _as_batch(grad_out, rows_q), _as_batch(query, rows_q), _as_batch(key, rows_k, groups),
            _as_batch(value, rows_k, groups), _as_batch(out, rows_q), lse[:, q0:q1].unsqueeze(0), 0.0, causal,
            attn_mask=mask, scale=scale)
        dq[rows_q].copy_(g_q[0].transpose(0, 1))
        # a key head's gradient is the sum over the query heads of its group
        dk[rows_k].copy_(g_k[0].unflatten(0, (hk, groups)).sum(1).transpose(0, 1))
        dv[rows_k].copy_(g_v[0].unflatten(0, (hk, groups)).sum(1).transpose(0, 1))
    return dq, dk, dv


def register() -> None:
    """Registers the three operators' neuron kernels (once; importing the varlen module defines them)."""
    import torch.nn.attention.varlen  # noqa: F401  (defines torch_attn::*)

    for name in _OPS:
        op = getattr(torch.ops.torch_attn, name).default
        if not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "PrivateUse1"):
            torch.library.register_kernel(f"torch_attn::{name}", "neuron", globals()[name])
