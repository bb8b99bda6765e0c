"""The streaming prefill of many short requests at once, as batched tensor work.

A context of at most chunk + S tokens is one prefill chunk: below l_R it attends to itself
causally, and the query then attends to the sink, the last W context tokens and itself. That is
the same computation for every short request, so B of them run as (B, T, D) tensors, contexts
and queries right-padded to the longest: every projection and MLP matmul (about 3/4 of the work)
is one call for all, which is where many small requests lose their time. Attention runs per
request through the same WindowCache and kernel calls as `streaming_prefill`, so each request
gets what it would get alone, bit for bit where the matmuls are (tests check the kept indices).
"""

from __future__ import annotations

import torch

from ..models.llama import TruncatedLM
from .context_state import RetrievalState
from .prefill_config import PrefillConfig
from .window_cache import WindowCache


def fits_one_chunk(length: int, config: PrefillConfig) -> bool:
    """True when a context of `length` tokens is a single prefill chunk (batchable)."""
    return length <= config.chunk + config.sink


def _padded(seqs: list[torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """[(T_b,)] int64 -> ids (B, T_max) right-padded with 0, lengths (B,) int64."""
    lengths = torch.tensor([s.numel() for s in seqs], device=device)
    ids = torch.zeros(len(seqs), int(lengths.max()), dtype=torch.int64, device=device)
    for b, seq in enumerate(seqs):
        ids[b, : seq.numel()] = seq.to(device)
    return ids, lengths


def batched_prefill(
    model: TruncatedLM, contexts: list[torch.Tensor], queries: list[torch.Tensor], config: PrefillConfig,
    score_layers: tuple[int, ...] | None = None, keep_streams: bool = False,
) -> list[RetrievalState]:
    """contexts[b]: (L_b,) int64 with L_b <= chunk + S; queries[b]: (Lq_b,) int64 ->
    one RetrievalState per request: keys (KV, L_b, d) and queries (H, Lq_b, d) at each of `score_layers`
    (default: l_R; the union of what the batch's strategies encode, e.g. l_R and a layer blended with it,
    or a cascade's coarse layer), computed as the streaming prefill computes them. keep_streams: with the top
    score layer below l_R, also the residual streams entering it, the context's (L_b, D) and the query's (Lq_b, D)
    (`stream`, `context_stream`: where a cascade's candidates start)."""
    if not all(fits_one_chunk(c.numel(), config) for c in contexts):
        limit = config.chunk + config.sink
        raise ValueError(f"context: batched prefill takes contexts of at most chunk + sink = {limit} tokens")
    l_r, device = model.n_layers, model.device
    ctx_ids, ctx_len = _padded(contexts, device)  # (B, T), (B,)
    qry_ids, qry_len = _padded(queries, device)  # (B, Tq), (B,)
    spans = list(zip(ctx_len.tolist(), qry_len.tolist()))
    cos_c, sin_c = model.rope(torch.arange(ctx_ids.shape[1], device=device))  # (T, d)
    cos_q, sin_q = model.rope(ctx_len[:, None] + torch.arange(qry_ids.shape[1], device=device))  # (B, Tq, d)
    cos_q, sin_q = cos_q[:, None], sin_q[:, None]  # (B, 1, Tq, d): broadcast over heads
    layers = tuple(sorted(set(score_layers or (l_r,))))
    if not 1 <= layers[0] <= layers[-1] <= l_r:
        raise ValueError(f"layer: score layers must be within 1..{l_r} (got {layers})")
    h_c, h_q = model.embed(ctx_ids), model.embed(qry_ids)  # (B, T, D), (B, Tq, D)
    kept_keys: dict[int, torch.Tensor] = {}
    kept_queries: dict[int, torch.Tensor] = {}
    streams: tuple[torch.Tensor, torch.Tensor] | None = None  # (B, T, D), (B, Tq, D) entering layers[-1]
    for l in range(1, min(layers[-1] + 1, l_r)):
        layer = model.layer(l)
        q, k, v = layer.qkv(h_c, cos_c, sin_c)  # (B, H, T, d), (B, KV, T, d) x2: one matmul for all
        qq, kq, vq = layer.qkv(h_q, cos_q, sin_q)  # (B, H, Tq, d), (B, KV, Tq, d) x2
        if l in layers:  # one chunk: no DCA move, the keys as the streaming prefill keeps them
            kept_keys[l], kept_queries[l] = k, qq
        if l == layers[-1]:  # the deepest layer asked for, below l_R: nothing above it is needed
            streams = (h_c, h_q) if keep_streams else None
            layer.drop(h_c), layer.drop(h_q)
            break
        out_c, out_q = torch.zeros_like(q), torch.zeros_like(qq)
        for b, (n, m) in enumerate(spans):  # attention per request, exactly as streaming_prefill runs it
            cache = WindowCache(config, m, model, layer=l)
            out_c[b, :, :n] = cache.attend(q[b, :, :n], k[b, :, :n], v[b, :, :n], 0, model.inv_freq)
            cache.append(k[b, :, :n], v[b, :, :n], first=True)
            out_q[b, :, :m] = cache.attend(qq[b, :, :m], kq[b, :, :m], vq[b, :, :m], 0, model.inv_freq)
        h_c, h_q = layer.finish(h_c, out_c), layer.finish(h_q, out_q)
    if layers[-1] == l_r:
        top = model.layer(l_r)
        kept_keys[l_r], kept_queries[l_r] = top.keys(h_c, cos_c, sin_c), top.queries(h_q, cos_q, sin_q)
    return [RetrievalState(keys={l: keys[b, :, :n] for l, keys in kept_keys.items()},
                           queries={l: queries[b, :, :m] for l, queries in kept_queries.items()},
                           stream=streams[1][b, :m] if streams else None,
                           context_stream=streams[0][b, :n] if streams else None)
            for b, (n, m) in enumerate(spans)]
