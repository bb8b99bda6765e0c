"""Coarse to fine: a shallow layer picks candidates over the whole context, the deep layer l_R ranks them.

Data flow of one query (the context was encoded up to the coarse layer l_c < l_R, as plain ILRe at l_c):
  query -> layers 1..l_c against the encoded context -> A^C at l_c over all L tokens
        -> candidates C: the sink, the last `recent` tokens, and Algorithm 1 at budget |C| (spans
           around the coarse layer's peaks)
  candidates (original positions) + query -> layers 1..l_R again, every candidate attending only to
        the candidates it would attend to in the streaming prefill: the sink, those within the
        window before its chunk, and those of its own chunk before it (the Λ mask restricted to C;
        DCA's sink and key moves by each token's original chunk)
        -> A^C at l_R over C (zero elsewhere) -> Algorithm 1 picks the budget.
Cost: the streaming prefill to l_c over L tokens plus l_R layers over |C| tokens, instead of l_R
layers over L. With C = the whole context the second pass is the streaming prefill at l_R itself,
so the result is plain ILRe at l_R. Memory: the key cache of l_c (as plain ILRe at l_c) plus one
window of K/V per layer for the candidates; nothing per context token beyond the keys.
"""

from __future__ import annotations

import torch

from ..kernels.chunk_attention import chunk_attention
from ..kernels.rope import rerotate
from ..models.llama import TruncatedLM
from .allocation import PoolingAllocator
from .prefill import PrefillConfig, chunk_bounds


def recent_share(count: int, config: PrefillConfig) -> int:
    """How many of `count` candidates are the context's last tokens: an eighth, at most the window
    (the query attends to the window before it below l_R, so with the default budget it sees
    exactly what it sees in the streaming prefill)."""
    return min(config.window or count, count // 8)


def pick_candidates(scores: torch.Tensor, count: int, sink: int, recent: int,
                    allocator: PoolingAllocator) -> torch.Tensor:
    """scores: (L,) coarse A^C -> (min(count, L),) int64 candidate indices, ascending: the first
    `sink` tokens, the last `recent`, and `allocator` (Algorithm 1) over the tokens between them
    for the rest of `count`."""
    length = scores.numel()
    if count >= length:
        return torch.arange(length, device=scores.device)
    head = min(sink, count)
    tail = min(recent, count - head)
    middle = scores[head:length - tail]
    picked = allocator.allocate(middle, count - head - tail) + head
    return torch.cat((torch.arange(head, device=scores.device), picked,
                      torch.arange(length - tail, length, device=scores.device)))


class _CandidateWindow:
    """The K/V one layer's candidates may attend to: the sink (kept at its own positions, moved by
    DCA as asked) and the non-sink candidates seen so far with their positions, trimmed to those
    within the window of the chunk about to run."""

    def __init__(self, config: PrefillConfig):
        self.sink, self.window = config.sink, config.window
        self.sink_k = self.sink_v = self.k = self.v = self.pos = None
        self._moved: tuple[int, torch.Tensor] | None = None  # (shift, sink keys moved by it)

    def prefix(self, start: int, sink_shift: int, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """K/V (KV, P, d) visible to a chunk starting at `start`: the sink (moved by `sink_shift`)
        and the candidates at positions >= start - W; None before the first chunk."""
        if self.sink_k is None:
            return None
        if self._moved is None or self._moved[0] != sink_shift:
            self._moved = (sink_shift, rerotate(self.sink_k, inv_freq, sink_shift))
        k, v = self._moved[1], self.sink_v
        if self.pos is not None and self.pos.numel():
            first = 0 if self.window is None else int(torch.searchsorted(self.pos, start - self.window))
            self.k, self.v, self.pos = self.k[:, first:], self.v[:, first:], self.pos[first:]
            k, v = torch.cat((k, self.k), dim=1), torch.cat((v, self.v), dim=1)
        return k, v

    def append(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> None:
        """Keep a chunk's K/V (KV, n, d) at positions pos (n,): those below S become the sink."""
        n_sink = int(torch.searchsorted(pos, self.sink)) if self.sink_k is None else 0
        if self.sink_k is None:
            self.sink_k, self.sink_v = k[:, :n_sink], v[:, :n_sink]
        k, v, pos = k[:, n_sink:], v[:, n_sink:], pos[n_sink:]
        if self.pos is None:
            self.k, self.v, self.pos = k, v, pos
        else:
            self.k, self.v = torch.cat((self.k, k), dim=1), torch.cat((self.v, v), dim=1)
            self.pos = torch.cat((self.pos, pos))


def candidate_prefill(model: TruncatedLM, context_ids: torch.Tensor, candidates: torch.Tensor,
                      query_ids: torch.Tensor, config: PrefillConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The streaming prefill of the candidates and the query through layers 1..l_R.

    context_ids: (L,) int64; candidates: (C,) int64 ascending context indices (the sink among them);
    query_ids: (Lq,) int64. Candidates are run in the context's own chunks, at their own positions,
    each seeing the sink and the candidates within the window before its chunk and of its chunk
    before it; DCA moves the sink (eq. 6) and the l_R keys (eq. 7) by each candidate's original
    chunk. Returns the l_R keys of the candidates (kv_heads, C, d) and the query states (heads, Lq, d).
    """
    length, device, l_r, spec = context_ids.numel(), model.device, model.n_layers, model.spec
    bounds = chunk_bounds(length, config)
    base = bounds[-2][0] if len(bounds) >= 2 else 0  # eq. 7 anchor
    edges = torch.tensor([start for start, _ in bounds] + [length], device=candidates.device)
    cuts = torch.searchsorted(candidates, edges).tolist()
    windows = [_CandidateWindow(config) for _ in range(l_r - 1)]
    keys = torch.empty(spec.num_kv_heads, candidates.numel(), spec.head_dim, dtype=model.dtype, device=device)
    ids = context_ids.to(device)
    for index, (start, _) in enumerate(bounds):
        a, b = cuts[index], cuts[index + 1]
        if a == b:
            continue
        pos = candidates[a:b].to(device)
        key_shift = base - start if config.dca and index < len(bounds) - 2 else 0
        sink_shift = (index - 1) * config.chunk if config.dca and index >= 2 else 0
        out = _through_layers(model, windows, ids[pos], pos, start, sink_shift, keep=True)
        keys[:, a:b] = rerotate(out, model.inv_freq, key_shift)
    n_chunks = len(bounds)
    sink_shift = (n_chunks - 1) * config.chunk if config.dca and n_chunks >= 2 else 0
    pos = torch.arange(length, length + query_ids.numel(), device=device)
    queries = _through_layers(model, windows, query_ids.to(device), pos, length, sink_shift, keep=False)
    return keys, queries


def _through_layers(model: TruncatedLM, windows: list[_CandidateWindow], ids: torch.Tensor, pos: torch.Tensor,
                    start: int, sink_shift: int, keep: bool) -> torch.Tensor:
    """One chunk of tokens ids (n,) at positions pos (n,), in the chunk that starts at `start`, through
    layers 1..l_R: a context chunk (keep=True) adds its K/V to the windows and returns its l_R keys
    (kv_heads, n, d); the query (keep=False) leaves the windows as they were and returns its l_R
    queries (heads, n, d)."""
    cos, sin = model.rope(pos)
    h = model.embed(ids)
    for l in range(1, model.n_layers):
        layer, window = model.layer(l), windows[l - 1]
        q, k, v = layer.qkv(h, cos, sin)  # (H, n, d), (KV, n, d), (KV, n, d)
        prefix = window.prefix(start, sink_shift, model.inv_freq)
        if prefix is None:
            out = chunk_attention(q, k, v, 0)
        else:
            out = chunk_attention(q, torch.cat((prefix[0], k), dim=1), torch.cat((prefix[1], v), dim=1),
                                  prefix[0].shape[1])
        if keep:
            window.append(k, v, pos)
        h = layer.finish(h, out)
    top = model.layer(model.n_layers)
    return top.keys(h, cos, sin) if keep else top.queries(h, cos, sin)
