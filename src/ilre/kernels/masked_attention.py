"""Attention of one block of queries under an explicit mask, with optional sink logits: the layers whose rule the
sink + window prefix alone does not state (a model's sliding or chunked window, gpt-oss's learned sinks, MLA's
narrower values)."""

from __future__ import annotations

import math

import torch


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor,
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k / sqrt(dk)) v over the visible keys, each row's denominator also holding exp(sink) of its head.

    q: (H, C, dk); k: (KV, N, dk); v: (KV, N, dv), H a multiple of KV (head h reads kv head h // (H / KV));
    visible: (C, N) bool, every row seeing at least one key; sinks: (H,) logits or None. Returns (H, C, dv) in q's
    dtype, computed in float32. Memory: one (H, C, N) block (a chunk against its prefix), never the context."""
    n_heads, n_rows, dim = q.shape
    n_kv = k.shape[0]
    group = n_heads // n_kv
    logits = (q.float() / math.sqrt(dim)).reshape(n_kv, group * n_rows, dim) @ k.float().transpose(1, 2)
    logits = logits.view(n_kv, group, n_rows, -1).masked_fill(~visible, -math.inf)
    top = logits.amax(dim=-1, keepdim=True)  # (KV, g, C, 1)
    if sinks is not None:
        sink = sinks.float().view(n_kv, group, 1, 1).expand_as(top)
        top = torch.maximum(top, sink)
    weights = torch.exp(logits - top)
    total = weights.sum(dim=-1, keepdim=True)
    if sinks is not None:
        total = total + torch.exp(sink - top)
    out = (weights / total).view(n_kv, group * n_rows, -1) @ v.float()
    return out.view(n_heads, n_rows, -1).to(q.dtype)


BAND_ROWS = 128  # rows per block of a sliding layer's band (fastest of 64-512 for Gemma 3's 512 window, 1024 chunk)


def sliding_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, at: torch.Tensor, rows: torch.Tensor,
                      window: int, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """`masked_attention` of a sliding-window layer: row i sees the keys at positions (rows[i] - window, rows[i]].

    q: (H, C, dk) at positions rows (C,) ascending; k: (KV, N, dk), v: (KV, N, dv) at positions at (N,) (a ring's
    order is any). Each block of BAND_ROWS rows is computed against only the keys some row of it sees (at most
    BAND_ROWS + window - 1), so a chunk longer than the window costs C x (BAND_ROWS + window) products, not
    C x N. Returns (H, C, dv) in q's dtype."""
    out = []
    for start in range(0, q.shape[1], BAND_ROWS):
        block = rows[start : start + BAND_ROWS]
        near = ((at > block[0] - window) & (at <= block[-1])).nonzero().squeeze(1)
        seen = at[near].unsqueeze(0)
        visible = (seen <= block.unsqueeze(1)) & (seen > block.unsqueeze(1) - window)
        out.append(masked_attention(q[:, start : start + BAND_ROWS], k[:, near], v[:, near], visible, sinks))
    return out[0] if len(out) == 1 else torch.cat(out, dim=1)
