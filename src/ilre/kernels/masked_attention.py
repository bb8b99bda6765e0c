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
