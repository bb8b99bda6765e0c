"""Blockwise query->context attention scores (ILRe eqs. 4-5), GQA-aware."""

from __future__ import annotations

import math

import torch


def query_key_scores(q: torch.Tensor, keys: torch.Tensor, block: int = 8192) -> torch.Tensor:
    """A^C[j] = max over heads h and query positions t of softmax_j(q_{h,t} . k_j / sqrt(d)).

    q: (heads, Lq, d) query states at the retrieval layer; keys: (kv_heads, L, d) post-RoPE context
    keys. Query head h is scored against kv head h // (heads / kv_heads) without repeating keys.
    Two passes over key blocks: a running max/sum gives each (head, query) row's log-sum-exp, then
    the normalised log-probabilities of each block are reduced by max (exponentiated once per token). Peak memory is one
    (heads, Lq, block) block. Returns (L,) float32.
    """
    n_heads, n_query, dim = q.shape
    n_kv, length, _ = keys.shape
    group = n_heads // n_kv
    qg = (q.float() / math.sqrt(dim)).reshape(n_kv, group * n_query, dim)  # (kv, g*Lq, d)
    row_max = torch.full((n_kv, group * n_query), -math.inf, device=q.device)
    row_sum = torch.zeros(n_kv, group * n_query, device=q.device)
    for start in range(0, length, block):
        logits = qg @ keys[:, start : start + block].float().transpose(1, 2)  # (kv, g*Lq, blk)
        new_max = torch.maximum(row_max, logits.amax(dim=-1))
        row_sum = row_sum * torch.exp(row_max - new_max) + torch.exp(
            logits - new_max.unsqueeze(-1)
        ).sum(dim=-1)
        row_max = new_max
    lse = (row_max + row_sum.log()).unsqueeze(-1)  # (kv, g*Lq, 1)
    scores = torch.empty(length, device=q.device)
    for start in range(0, length, block):
        logits = qg @ keys[:, start : start + block].float().transpose(1, 2)
        scores[start : start + block] = (logits - lse).amax(dim=(0, 1))
    return scores.exp_()  # exp is monotonic: the max of the probabilities is exp of the max, one exp per token


def blend_layers(primary: torch.Tensor, others: list[torch.Tensor], weight: float, sink: int) -> torch.Tensor:
    """Element-wise max of layers' A^C (L,) each scaled to sum 1 outside the first `sink` tokens,
    `others` (lower layers) times `weight`: a token either layer singles out scores high."""
    scaled = torch.stack([a / a[sink:].sum().clamp_min(1e-30) for a in (primary, *others)])
    scaled[1:] *= weight
    return scaled.amax(dim=0)
