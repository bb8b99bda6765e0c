"""Plain, obviously-correct reference implementations, used only by the tests.

Nothing here is optimised: whole-sequence masks, dense softmaxes, Python loops. Each function says
which product function it is a reference for.
"""

from __future__ import annotations

import math

import torch

from ilre.compressor.context_state import chunk_bounds
from ilre.compressor.prefill_config import PrefillConfig
from ilre.kernels.rope import rerotate


# --------------------------------------------------------------------------------------------
# Λ mask and dense prefill (reference for compressor.prefill.streaming_prefill)
# --------------------------------------------------------------------------------------------


def lambda_mask(
    total_len: int, sink: int, window: int | None, bounds: list[tuple[int, int]]
) -> torch.Tensor:
    """(T, T) bool: mask[i, j] is True iff token i may attend token j.

    `bounds` are the [start, end) of the context chunks; the tokens from the end of the last one up
    to total_len (the query) form one more chunk. Token i in the chunk starting at c0 sees j iff
    j <= i and (j < sink or j >= c0 - window or j >= c0); window None = unbounded.
    """
    starts = [0] * total_len
    context_end = bounds[-1][1] if bounds else 0
    for c0, c1 in list(bounds) + [(context_end, total_len)]:
        for i in range(c0, c1):
            starts[i] = c0
    mask = torch.zeros(total_len, total_len, dtype=torch.bool)
    for i in range(total_len):
        c0 = starts[i]
        for j in range(i + 1):
            in_window = window is None or j >= c0 - window
            mask[i, j] = j < sink or in_window or j >= c0
    return mask


def _chunk_index_of_rows(total_len: int, bounds: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """[(start, end, chunk index)] for the context chunks plus the query chunk (index N_C)."""
    context_end = bounds[-1][1] if bounds else 0
    rows = [(a, b, i) for i, (a, b) in enumerate(bounds)]
    return rows + [(context_end, total_len, len(bounds))]


def _dense_attention(q, k_per_chunk, v, mask, rows):
    """q: (H, T, d); k_per_chunk[c]: (KV, T, d) keys as seen by the rows of chunk c; v: (KV, T, d);
    mask: (T, T) bool. Plain masked softmax attention, KV heads repeated for GQA -> (H, T, d)."""
    n_heads, total, dim = q.shape
    group = n_heads // v.shape[0]
    v_rep = v.repeat_interleave(group, dim=0)  # (H, T, d)
    out = torch.empty_like(q)
    for start, end, c in rows:
        if start == end:
            continue
        k_rep = k_per_chunk[c].repeat_interleave(group, dim=0)  # (H, T, d)
        logits = q[:, start:end] @ k_rep.transpose(1, 2) / math.sqrt(dim)  # (H, C, T)
        logits = logits.masked_fill(~mask[start:end], -math.inf)
        out[:, start:end] = torch.softmax(logits, dim=-1) @ v_rep
    return out


def dense_stream(model, context_ids: torch.Tensor, query_ids: torch.Tensor, config: PrefillConfig,
                 layer: int) -> torch.Tensor:
    """The residual stream (L + Lq, D) of context then query entering `layer`, as `dense_prefill` computes it."""
    return dense_prefill(model, context_ids, query_ids, config, layer, stream=True)


def dense_prefill(
    model, context_ids: torch.Tensor, query_ids: torch.Tensor, config: PrefillConfig, layer: int | None = None,
    stream: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole-sequence version of the streaming prefill with an explicit Λ mask.

    Runs `model` (an ilre TruncatedLM) over context + query at absolute positions 0..L+Lq-1 with
    dense masked attention in layers < `layer` (default: the model's last layer) and returns the
    layer-`layer` context keys (kv_heads, L, d) and query states (heads, Lq, d).

    DCA (config.dca), written directly from eqs. 6-7 without re-rotating anything: every key is
    computed by RoPE at the position it is meant to sit at.
      eq. 6: rows of chunk c (0-based; the query is chunk N_C) with c >= 2 see the sink keys as if
             the sink tokens sat at positions p + (c - 1) * chunk (paper: R^{i-2}(D_C), i = c + 1);
      eq. 7: at the returned layer, the keys of context chunk c <= N_C - 3 sit at positions
             p + (start of chunk N_C - 2) - (start of chunk c), i.e. moved onto chunk N_C - 1 (1-based).
    """
    layer = model.n_layers if layer is None else layer
    length, n_query = context_ids.numel(), query_ids.numel()
    total = length + n_query
    bounds = chunk_bounds(length, config)
    rows = _chunk_index_of_rows(total, bounds)
    mask = lambda_mask(total, config.sink, config.window, bounds)  # (T, T)
    positions = torch.arange(total)
    n_sink = min(config.sink, length)
    h = model.embed(torch.cat((context_ids, query_ids)))  # (T, D)
    cos, sin = model.rope(positions)  # (T, d)
    with torch.no_grad():
        for l in range(1, layer + 1):
            lay = model.layer(l)
            if l == layer and stream:
                return h
            if l == layer:
                keys = lay.keys(h[:length], cos[:length], sin[:length])  # (KV, L, d)
                if config.dca and len(bounds) >= 3:
                    base = bounds[-2][0]
                    for start, end in bounds[:-2]:
                        c2, s2 = model.rope(positions[start:end] + (base - start))
                        keys[:, start:end] = lay.keys(h[start:end], c2, s2)
                return keys, lay.queries(h[length:], cos[length:], sin[length:])
            q, k, v = lay.qkv(h, cos, sin)  # (H, T, d), (KV, T, d), (KV, T, d)
            k_per_chunk = {}
            for _, _, c in rows:
                k_c = k.clone()
                if config.dca and c >= 2 and n_sink:
                    c2, s2 = model.rope(positions[:n_sink] + (c - 1) * config.chunk)
                    k_c[:, :n_sink] = lay.keys(h[:n_sink], c2, s2)
                k_per_chunk[c] = k_c
            h = lay.finish(h, _dense_attention(q, k_per_chunk, v, mask, rows))
    raise AssertionError("unreachable")


def dense_candidate_prefill(model, context_ids: torch.Tensor, candidates: list[int], query_ids: torch.Tensor,
                            config: PrefillConfig, start: tuple[int, torch.Tensor] | None = None, rows=None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference for compressor.candidate_prefill.candidate_prefill: the dense masked prefill of the sequence
    (candidates, then the query) at their original positions, where token i may attend token j iff
    the whole-context Λ mask lets it (the mask restricted to the candidates). DCA as in
    `dense_prefill`, each token in its original chunk. Returns the l_R keys of the candidates
    (KV, C, d) and the query states (H, Lq, d). start: (layer, stream (L + Lq, D) entering it, as `dense_stream`
    gives it): the rows enter that layer with their stream instead of layer 1 with their embeddings. rows: a
    CandidateRows (compressor/candidate_rows.py): each candidate it holds takes its K/V at every layer from
    rows.first on, and its l_R key, from there (moved by DCA as the others) instead of computing them."""
    length, n_query = context_ids.numel(), query_ids.numel()
    total = length + n_query
    bounds = chunk_bounds(length, config)
    rows_of = _chunk_index_of_rows(total, bounds)
    chunk_of = [c for start, end, c in rows_of for _ in range(start, end)]
    keep = list(candidates) + list(range(length, total))  # original positions of the sequence
    n_cand = len(candidates)
    full_mask = lambda_mask(total, config.sink, config.window, bounds)
    mask = full_mask[keep][:, keep]  # (T', T')
    positions = torch.tensor(keep)
    chunks = [chunk_of[p] for p in keep]
    rows_of_chunks = []  # (start, end, chunk) runs of equal chunk index in the sequence
    for i, c in enumerate(chunks):
        if rows_of_chunks and rows_of_chunks[-1][2] == c:
            rows_of_chunks[-1] = (rows_of_chunks[-1][0], i + 1, c)
        else:
            rows_of_chunks.append((i, i + 1, c))
    sink_rows = [i for i, p in enumerate(keep) if p < config.sink]
    first, h = (1, model.embed(torch.cat((context_ids[candidates], query_ids)))) if start is None else (
        start[0], start[1][keep].clone())
    cos, sin = model.rope(positions)
    l_r = model.n_layers
    held = {}  # sequence row -> its row in `rows`
    if rows is not None:
        for i, p in enumerate(candidates):
            found = (rows.positions == p).nonzero()
            if found.numel():
                held[i] = int(found[0, 0])
    with torch.no_grad():
        for l in range(first, l_r + 1):
            lay = model.layer(l)
            if l == l_r:
                keys = lay.keys(h[:n_cand], cos[:n_cand], sin[:n_cand])
                for i, r in held.items():
                    keys[:, i] = rows.top[:, r]
                if config.dca and len(bounds) >= 3:
                    base = bounds[-2][0]
                    for i, p in enumerate(candidates):
                        c = chunks[i]
                        if c < len(bounds) - 2:
                            if i in held:
                                keys[:, i:i + 1] = rerotate(keys[:, i:i + 1], model.inv_freq, base - bounds[c][0])
                                continue
                            c2, s2 = model.rope(torch.tensor([p + base - bounds[c][0]]))
                            keys[:, i:i + 1] = lay.keys(h[i:i + 1], c2, s2)
                return keys, lay.queries(h[n_cand:], cos[n_cand:], sin[n_cand:])
            q, k, v = lay.qkv(h, cos, sin)
            if held and l >= rows.first:
                for i, r in held.items():
                    k[:, i], v[:, i] = rows.keys[l - rows.first][:, r], rows.values[l - rows.first][:, r]
            k_per_chunk = {}
            for _, _, c in rows_of_chunks:
                k_c = k.clone()
                if config.dca and c >= 2 and sink_rows:
                    c2, s2 = model.rope(positions[sink_rows] + (c - 1) * config.chunk)
                    k_c[:, sink_rows] = lay.keys(h[sink_rows], c2, s2)
                    for i in sink_rows:
                        if i in held and l >= rows.first:
                            k_c[:, i:i + 1] = rerotate(k[:, i:i + 1], model.inv_freq, (c - 1) * config.chunk)
                k_per_chunk[c] = k_c
            h = lay.finish(h, _dense_attention(q, k_per_chunk, v, mask, rows_of_chunks))
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------------------------
# Scores (reference for kernels.query_scores.query_key_scores)
# --------------------------------------------------------------------------------------------


def dense_scores(q: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """q: (H, Lq, d), keys: (KV, L, d) -> (L,): max over heads and queries of the softmax over all
    context keys (eqs. 4-5); query head h reads kv head h // (H / KV)."""
    group = q.shape[0] // keys.shape[0]
    k_rep = keys.double().repeat_interleave(group, dim=0)  # (H, L, d)
    logits = q.double() @ k_rep.transpose(1, 2) / math.sqrt(q.shape[-1])  # (H, Lq, L)
    probs = torch.softmax(logits, dim=-1)
    return probs.amax(dim=(0, 1))


# --------------------------------------------------------------------------------------------
# Algorithm 1 (reference for compressor.allocation.PoolingAllocator)
# --------------------------------------------------------------------------------------------


def literal_algorithm1(
    scores: list[float], budget: int, max_kernels: tuple[int, ...], avg_kernels: tuple[int, ...]
) -> list[int]:
    """Algorithm 1 of ILRe, loop by loop, with the readings documented in compressor/allocation.py.

    scores: per-token scores (sink excluded), as Python floats. Returns the kept indices, ascending.
    """
    scores = [float(s) for s in scores]
    length = len(scores)
    if budget >= length:
        return list(range(length))
    n_comb = len(max_kernels) * len(avg_kernels)
    taken: set[int] = set()
    comb = 0
    for m in max_kernels:
        k_m = budget // m + 1
        # MaxPooling, size = stride = m, a partial last block is a block of its own.
        n_blocks = (length + m - 1) // m
        maxed = []
        for b in range(n_blocks):
            block = scores[b * m : min((b + 1) * m, length)]
            best = block[0]
            for value in block[1:]:
                if value > best:
                    best = value
            maxed.append(best)
        for n in avg_kernels:
            # AvgPooling, stride 1, window [i - (n-1)//2, i + n//2] clipped, mean of in-range values.
            avg = []
            for i in range(n_blocks):
                lo = max(0, i - (n - 1) // 2)
                hi = min(n_blocks - 1, i + n // 2)
                window = maxed[lo : hi + 1]
                avg.append(math.fsum(window) / len(window))
            # Top K_m blocks by pooled score, ties by lower block index.
            ranked_blocks = sorted(range(n_blocks), key=lambda b: (-avg[b], b))[:k_m]
            candidates = []
            for b in ranked_blocks:
                for offset in range(m):
                    token = b * m + offset
                    if token < length:
                        candidates.append(token)
            share = (comb + 1) * budget // n_comb - comb * budget // n_comb
            added = 0
            for token in candidates:
                if added >= share:
                    break
                if token not in taken:
                    taken.add(token)
                    added += 1
            comb += 1
    # Fill what the combinations could not from the highest raw scores.
    for token in sorted(range(length), key=lambda j: (-scores[j], j)):
        if len(taken) >= budget:
            break
        taken.add(token)
    return sorted(taken)


# --------------------------------------------------------------------------------------------
# LagKV, section 2.2 (reference for compressor.strategies.lagkv)
# --------------------------------------------------------------------------------------------


def literal_lagkv(keys: torch.Tensor, values: torch.Tensor, budget: int, sink: int, lag: int,
                  heads: str = "sum", eps: float = 1e-6) -> list[int]:
    """The paper's steps one token, channel and partition at a time -> kept indices (ascending).

    keys, values: (kv_heads, L, d). Sink and the last full partition + remainder stay; partition p
    is normalised by the min/max of partition p + 1, std over channels, softmax over the partition,
    K + V, heads summed (or maxed); each partition keeps its quota (budget left shared evenly, the
    remainder to the last partitions) of best tokens, ties by lower index. Fewer than two
    partitions, or no room for the window: the sink and the most recent tokens."""
    n_kv, length, dim = keys.shape
    sink = min(sink, length)
    full = max(0, length - sink) // lag
    n = full - 1 if full >= 2 else 0
    window = length - sink - n * lag
    left = budget - sink - window
    if n == 0 or left < 0:
        head = min(sink, budget)
        return list(range(head)) + list(range(length - (budget - head), length))
    kept = list(range(sink))
    for p in range(n):
        start, ref = sink + p * lag, sink + (p + 1) * lag
        token_scores = [0.0 if heads == "sum" else -math.inf] * lag
        for h in range(n_kv):
            per_head = [0.0] * lag
            for z in (keys, values):
                stds = []
                for t in range(lag):
                    normed = []
                    for c in range(dim):
                        column = [float(z[h, ref + u, c]) for u in range(lag)]
                        low, high = min(column), max(column)
                        normed.append((float(z[h, start + t, c]) - low) / (high - low + eps))
                    mean = sum(normed) / dim
                    stds.append(math.sqrt(sum((x - mean) ** 2 for x in normed) / (dim - 1)))
                top = max(stds)
                exps = [math.exp(x - top) for x in stds]
                for t in range(lag):
                    per_head[t] += exps[t] / sum(exps)
            for t in range(lag):
                token_scores[t] = token_scores[t] + per_head[t] if heads == "sum" else max(token_scores[t], per_head[t])
        quota = left // n + (1 if p >= n - left % n else 0)
        ranked = sorted(range(lag), key=lambda t: (-token_scores[t], t))
        kept += sorted(start + t for t in ranked[:quota])
    return kept + list(range(length - window, length))


# --------------------------------------------------------------------------------------------
# ReAttention, section 3 (reference for compressor.strategies.reattention)
# --------------------------------------------------------------------------------------------


def literal_reattention(raw_q: torch.Tensor, raw_k: torch.Tensor, budget: int, glob: int, local: int,
                        span: int, k: int, k_prime: int | None = None) -> list[int]:
    """One head, one query token, one key at a time -> kept indices (ascending).

    raw_q: (heads, Lq, d), raw_k: (kv_heads, L, d), both before RoPE. Global [0, glob) and local
    [L - local, L) stay; each (head, query token) ranks the middle by q . k (ties: lower index) and
    gives its r-th best of k tokens k - r votes; winners by votes (ties: lower index, at most
    k_prime) bring the span [w - span//2, w - span//2 + span) in the middle, nearest first; new
    tokens are taken until the budget is met, then the most recent middle tokens fill the rest."""
    n_heads, n_query, _ = raw_q.shape
    n_kv, length, _ = raw_k.shape
    lo, hi = glob, length - local
    votes = [0.0] * length
    for h in range(n_heads):
        for t in range(n_query):
            dots = [(float(torch.dot(raw_q[h, t].double(), raw_k[h // (n_heads // n_kv), j].double())), j)
                    for j in range(lo, hi)]
            ranked = sorted(dots, key=lambda item: (-item[0], item[1]))
            for rank, (_, j) in enumerate(ranked[:k]):
                votes[j] += k - rank
    winners = sorted((j for j in range(lo, hi) if votes[j] > 0), key=lambda j: (-votes[j], j))
    if k_prime is not None:
        winners = winners[:k_prime]
    room, picked = budget - glob - local, []
    for w in winners:
        offsets = sorted(range(-(span // 2), span - span // 2), key=lambda o: (abs(o), o))
        for o in offsets:
            i = w + o
            if lo <= i < hi and i not in picked and len(picked) < room:
                picked.append(i)
    for i in range(hi - 1, lo - 1, -1):
        if len(picked) < room and i not in picked:
            picked.append(i)
    return sorted(list(range(glob)) + picked + list(range(hi, length)))


# --------------------------------------------------------------------------------------------
# Locret, section 4 (reference for models.retaining_head and compressor.strategies.locret)
# --------------------------------------------------------------------------------------------


def literal_retaining_scores(raw_q: torch.Tensor, raw_k: torch.Tensor, values: torch.Tensor, w1: torch.Tensor,
                             w2: torch.Tensor) -> list[list[float]]:
    """R([q, k, v]) = silu([q, k, v] W1) W2 one token, unit and head at a time -> [kv head][token].

    raw_q: (heads, L, d), raw_k / values: (kv_heads, L, d); a token's input is its query heads, then
    its key heads, then its value heads, each head's d channels in order."""
    n_kv, length, _ = raw_k.shape
    w1, w2 = w1.detach(), w2.detach()
    out = [[0.0] * length for _ in range(n_kv)]
    for t in range(length):
        x = [float(c) for z in (raw_q, raw_k, values) for h in range(z.shape[0]) for c in z[h, t]]
        hidden = []
        for u in range(w1.shape[1]):
            a = sum(x[i] * float(w1[i, u]) for i in range(len(x)))
            hidden.append(a / (1.0 + math.exp(-a)))
        for j in range(n_kv):
            out[j][t] = sum(hidden[u] * float(w2[u, j]) for u in range(len(hidden)))
    return out


def literal_locret(scores: list[float], budget: int, sink: int, local: int, stabilisers: int, chunk: int) -> list[int]:
    """Algorithm 1 of Locret with a cache of (score, index) units -> kept indices (ascending).

    The first `sink` tokens score +inf; the last `local` tokens are left out of the chunks and
    appended at the end; after each chunk but the last, the last `stabilisers` cache units get +inf
    on a copy, and the top budget - local stay (ties: lower index)."""
    length = len(scores)
    sink = min(sink, budget)
    local = min(local, budget - sink)
    cap = budget - local
    base = [math.inf if i < sink else s for i, s in enumerate(scores)]
    chunks = [(a, min(a + chunk, length - local)) for a in range(0, length - local, chunk)]
    cache: list[int] = []
    for n, (begin, end) in enumerate(chunks):
        cache = cache + list(range(begin, end))
        copy = {i: base[i] for i in cache}
        if n < len(chunks) - 1:
            for i in cache[max(0, len(cache) - stabilisers):] if stabilisers else []:
                copy[i] = math.inf
        top = sorted(cache, key=lambda i: (-copy[i], i))[:cap]
        cache = sorted(top)
    return cache + list(range(length - local, length))


# --------------------------------------------------------------------------------------------
# ActQKV, section 4 as reconstructed (reference for compressor.strategies.actqkv)
# --------------------------------------------------------------------------------------------


def literal_probe(raw_q: torch.Tensor, skip: int = 0, question_weight: float = 0.0) -> list[list[float]]:
    """The activation-aware probe one head, token and channel at a time -> [head][channel].

    phi_j = mean_c (q_jc - mu_c)^2 / (var_c + mean(var) / 100), weights phi / sum(phi) (uniform if
    all 0), probe = sum_j w_j q_j; with question_weight, unit(probe) + question_weight x unit(mean q)."""
    n_heads, n_query, dim = raw_q.shape
    start = min(skip, n_query - 1)
    out = []
    for h in range(n_heads):
        rows = [[float(x) for x in raw_q[h, j]] for j in range(start, n_query)]
        n = len(rows)
        mu = [sum(r[c] for r in rows) / n for c in range(dim)]
        var = [sum((r[c] - mu[c]) ** 2 for r in rows) / n for c in range(dim)]
        eps = sum(var) / dim / 100.0 + 1e-12
        phi = [sum((r[c] - mu[c]) ** 2 / (var[c] + eps) for c in range(dim)) / dim for r in rows]
        total = sum(phi)
        weights = [p / total for p in phi] if total > 0 else [1.0 / n] * n
        probe = [sum(weights[j] * rows[j][c] for j in range(n)) for c in range(dim)]
        if question_weight:
            norm = math.sqrt(sum(x * x for x in probe)) or 1.0
            mean_norm = math.sqrt(sum(x * x for x in mu)) or 1.0
            probe = [probe[c] / norm + question_weight * mu[c] / mean_norm for c in range(dim)]
        out.append(probe)
    return out


def literal_actqkv_scores(raw_q: torch.Tensor, raw_k: torch.Tensor, skip: int = 0,
                         question_weight: float = 0.0) -> list[float]:
    """Score of token j: mean over query heads h of cos(probe_h, k_j of h's KV head), one at a time."""
    n_heads, _, dim = raw_q.shape
    n_kv, length, _ = raw_k.shape
    probe = literal_probe(raw_q, skip, question_weight)
    scores = []
    for j in range(length):
        total = 0.0
        for h in range(n_heads):
            k = [float(x) for x in raw_k[h // (n_heads // n_kv), j]]
            dot = sum(probe[h][c] * k[c] for c in range(dim))
            norms = math.sqrt(sum(x * x for x in probe[h])) * math.sqrt(sum(x * x for x in k))
            total += dot / max(norms, 1e-12)
        scores.append(total / n_heads)
    return scores


def literal_entropy_budget(middle: list[float], budget: int, min_budget: int, temperature: float) -> int:
    """D = entropy(softmax(s / temperature)) / log N over the retrievable scores; min + round(D x (budget - min))."""
    top = max(middle)
    exps = [math.exp((s - top) / temperature) for s in middle]
    z = sum(exps)
    entropy = -sum(e / z * math.log(e / z) for e in exps if e > 0)
    density = entropy / math.log(len(middle)) if len(middle) > 1 else 1.0
    low = min(min_budget, budget)
    return max(low, min(budget, low + round(density * (budget - low))))


def literal_actqkv(scores: list[float], budget: int, sink: int, local: int, chunk: int) -> list[int]:
    """Sink [0, sink) and the last `local` tokens stay; the middle is cut into chunks of `chunk` from
    `sink`, ranked by their best token (ties: earlier chunk), taken whole best first and the last one
    by its best tokens (ties: lower index) -> kept indices (ascending), exactly `budget`."""
    length = len(scores)
    room = budget - sink - local
    chunks = [list(range(a, min(a + chunk, length - local))) for a in range(sink, length - local, chunk)]
    ranked = sorted(range(len(chunks)), key=lambda c: (-max(scores[i] for i in chunks[c]), c))
    picked: list[int] = []
    for c in ranked:
        for i in sorted(chunks[c], key=lambda i: (-scores[i], i)):
            if len(picked) < room:
                picked.append(i)
    return sorted(list(range(sink)) + picked + list(range(length - local, length)))


# --------------------------------------------------------------------------------------------
# whole units (reference for compressor.unit_selection.select_units)
# --------------------------------------------------------------------------------------------


def literal_select_units(scores: list[float], bounds: list[int], tokens: list[int], sink: int,
                         heads: list[tuple[int, int]] | None = None) -> list[int]:
    """The rule of unit_selection.py as a loop: units (cut at the sink) touched by `tokens` first, then by
    the share of their tokens in `tokens` plus their peak (best score scaled to [0, 1] against the lowest
    best or 0 and the highest, at least half a neighbour's), float32 as there, then by position; whole units
    while they fit len(tokens) - sink; the next one trimmed to a window around its first best token.
    heads: per unit of `bounds`, the token span of its table header or (-1, -1): a unit whose header is not
    yet kept costs its header's tokens after the sink too and brings them (a unit inside its header costs
    just the header); the unit that does not fit with its header but would without it is kept whole with
    its header's first tokens."""
    f32 = torch.float32
    length, budget = len(scores), len(tokens)
    sink = min(sink, budget, length)
    cuts = sorted({min(max(b, sink), length) for b in bounds} | {sink, length})
    units = list(zip(cuts, cuts[1:]))
    chosen = set(tokens)
    best = [torch.tensor(max(scores[a:z]), dtype=f32) for a, z in units]
    low = min(min(best), torch.tensor(0.0, dtype=f32))
    span = max(max(best) - low, torch.tensor(torch.finfo(f32).tiny, dtype=f32))
    scaled = [(b - low) / span for b in best]
    keyed = []
    for u, (a, z) in enumerate(units):
        beside = [scaled[v] for v in (u - 1, u + 1) if 0 <= v < len(units)]
        peak = max([scaled[u]] + [torch.tensor(0.5, dtype=f32) * b for b in beside])
        count = torch.tensor(float(sum(t in chosen for t in range(a, z))), dtype=f32)
        key = (count > 0).to(f32) * 4 + count / torch.tensor(z - a) + peak
        keyed.append((-float(key), u))
    keyed.sort()
    kept, room = list(range(sink)), budget - sink
    paid = set()
    for _, u in keyed:
        a, z = units[u]
        head = (-1, -1)
        if heads is not None:
            original = max(i for i, b in enumerate(bounds[:-1]) if b <= a)
            head = tuple(heads[original])
            if head[1] <= sink:
                head = (-1, -1)  # a header inside the sink is kept already
        new_tokens = set(range(a, z)) - set(kept)
        if head[0] >= 0 and head not in paid:
            new_tokens |= set(range(max(head[0], sink), head[1]))
        if len(new_tokens) <= room:
            kept += sorted(new_tokens)
            room -= len(new_tokens)
            if head[0] >= 0:
                paid.add(head)
            continue
        if room > 0 and head[0] >= 0 and head not in paid and z - a < room:  # whole, with its header's start
            kept += range(a, z)
            kept += [t for t in range(max(head[0], sink), head[1]) if t not in kept][: room - (z - a)]
        elif room > 0:
            peak_at = a + max(range(z - a), key=lambda i: (scores[a + i], -i))
            first = min(max(peak_at - room // 2, a), z - room)
            kept += range(first, first + room)
        break
    return sorted(kept)


def full_depth_options(profile) -> dict:
    """What a deepened cascade document stands for, as plain ILRe's request options (reference for the cascade's
    `deepened()` form): l_R's attention with the profile's coarse layer beside it at its weight."""
    options = profile.strategy_options("cascade")
    return {"also_layers": [options["coarse_layer"]], "also_weight": options.get("coarse_weight", 0.5)}
