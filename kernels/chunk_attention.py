"""Attention of one prefill chunk over [sink | sliding window | itself] (the Λ mask, streamed)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def chunk_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_prefix: int
) -> torch.Tensor:
    """One chunk of the streaming chunked prefill.

    q: (heads, C, d) queries of the chunk; k, v: (kv_heads, P + C, d) with the P = `n_prefix`
    cached sink + window entries first, then the chunk's own. Every query sees the whole prefix and
    the chunk causally. heads must be a multiple of kv_heads (GQA: head h reads kv head h // group).
    Returns (heads, C, d). Memory: one (heads, C, P + C) block, never the whole context.
    """
    n_chunk = q.shape[1]
    causal = torch.ones(n_chunk, n_chunk, dtype=torch.bool, device=q.device).tril()
    prefix = torch.ones(n_chunk, n_prefix, dtype=torch.bool, device=q.device)
    mask = torch.cat((prefix, causal), dim=1)  # (C, P + C)
    return F.scaled_dot_product_attention(
        q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=mask, enable_gqa=True
    ).squeeze(0)
