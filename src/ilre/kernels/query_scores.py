"""Blockwise query->context attention scores (ILRe eqs. 4-5), GQA-aware."""

from __future__ import annotations

import math
from typing import Iterator

import torch

from .rope import MovedKeys, rope_cos_sin, rotate_half


def query_key_scores(q: torch.Tensor, keys: torch.Tensor | MovedKeys, block: int = 2048) -> torch.Tensor:
    """A^C[j] = max over heads h and query positions t of softmax_j(q_{h,t} . k_j / sqrt(d)).

    q: (heads, Lq, d) query states at the retrieval layer; keys: (kv_heads, L, d) post-RoPE context
    keys, or MovedKeys (DCA): each moved span is scored with the query moved back instead, the keys never copied.
    Query head h is scored against kv head h // (heads / kv_heads) without repeating keys.
    Two passes over key blocks: a running max/sum gives each (head, query) row's log-sum-exp, then
    the normalised log-probabilities of each block are reduced by max (exponentiated once per token). Peak memory is one
    (heads, Lq, block) block. Returns (L,) float32.
    """
    n_heads, n_query, dim = q.shape
    n_kv, length, _ = keys.shape
    group = n_heads // n_kv
    qg = (q.float() / math.sqrt(dim)).reshape(n_kv, group * n_query, dim)  # (kv, g*Lq, d)
    raw, spans, inv_freq = (keys.keys, keys.spans, keys.inv_freq) if isinstance(keys, MovedKeys) else (keys, (), None)
    blocks = _blocks(spans, length, block)

    def logits_of(start: int, end: int, query: torch.Tensor) -> torch.Tensor:  # (kv, g*Lq, end - start)
        return query @ raw[:, start:end].float().transpose(1, 2)

    row_max = torch.full((n_kv, group * n_query), -math.inf, device=q.device)
    row_sum = torch.zeros(n_kv, group * n_query, device=q.device)
    for (start, end), query in _moved_queries(qg, blocks, inv_freq):
        logits = logits_of(start, end, query)
        new_max = torch.maximum(row_max, logits.amax(dim=-1))
        row_sum = row_sum * torch.exp(row_max - new_max) + torch.exp(logits - new_max.unsqueeze(-1)).sum(dim=-1)
        row_max = new_max
    lse = (row_max + row_sum.log()).unsqueeze(-1)  # (kv, g*Lq, 1)
    scores = torch.empty(length, device=q.device)
    for (start, end), query in _moved_queries(qg, blocks, inv_freq):
        scores[start:end] = (logits_of(start, end, query) - lse).amax(dim=(0, 1))
    return scores.exp_()  # exp is monotonic: the max of the probabilities is exp of the max, one exp per token


def _blocks(spans: tuple[tuple[int, int, int], ...], length: int, block: int) -> list[tuple[int, int, int]]:
    """(start, end, shift) blocks of at most `block` keys covering [0, length), each within one of the moved `spans`
    (start, end, shift) or in the unmoved rest (shift 0)."""
    runs, at = [], 0
    for start, end, shift in sorted(spans):
        if at < start:
            runs.append((at, start, 0))
        runs.append((start, end, shift))
        at = end
    runs.append((at, length, 0))
    return [(a, min(end, a + block), shift) for start, end, shift in runs for a in range(start, end, block)]


def _moved_queries(qg: torch.Tensor, blocks: list[tuple[int, int, int]], inv_freq: torch.Tensor | None
                   ) -> Iterator[tuple[tuple[int, int], torch.Tensor]]:
    """Each block's (start, end) with the query that scores it: qg (kv, g*Lq, d) moved by -shift (R(-s) q =
    q cos - rot(q) sin, the tables of every shift made at once; one move per run of equal shifts)."""
    shifts = sorted({shift for _, _, shift in blocks} - {0})
    if shifts:
        cos, sin = rope_cos_sin(inv_freq, torch.tensor(shifts, device=qg.device))  # (n, d) each
        row, turned = {shift: i for i, shift in enumerate(shifts)}, rotate_half(qg)
    query, last = qg, 0
    for start, end, shift in blocks:
        if shift != last:
            query = qg if shift == 0 else qg * cos[row[shift]] - turned * sin[row[shift]]
            last = shift
        yield (start, end), query


def blend_layers(primary: torch.Tensor, others: list[torch.Tensor], weight: float, sink: int) -> torch.Tensor:
    """Element-wise max of layers' A^C (L,) each scaled to sum 1 outside the first `sink` tokens,
    `others` (lower layers) times `weight`: a token either layer singles out scores high."""
    scaled = torch.stack([a / a[sink:].sum().clamp_min(1e-30) for a in (primary, *others)])
    scaled[1:] *= weight
    return scaled.amax(dim=0)
