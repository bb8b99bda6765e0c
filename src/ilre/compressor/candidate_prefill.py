"""The candidate prefill of the cascade (compressor/strategies/cascade.py): candidates run to l_R.

Data flow of one query (the context was encoded up to the coarse layer l_c < l_R, as plain ILRe at l_c):
  query -> layers 1..l_c against the encoded context -> A^C at l_c over all L tokens
        -> candidates C (the strategy's choice): the sink, the last `recent` tokens, and Algorithm 1 at
           budget |C| (spans around the coarse layer's peaks)
  candidates (original positions) + query -> layers 1..l_R again, every candidate attending only to
        the candidates it would attend to in the streaming prefill: the sink, those within the
        window before its chunk, and those of its own chunk before it (the Λ mask restricted to C;
        DCA's sink and key moves by each token's original chunk)
        -> A^C at l_R over C (zero elsewhere) -> Algorithm 1 picks the budget.
Cost: the streaming prefill to l_c over L tokens plus l_R layers over |C| tokens, instead of l_R
layers over L. With C = the whole context the second pass is the streaming prefill at l_R itself,
so the result is plain ILRe at l_R. Memory: the key cache of l_c (as plain ILRe at l_c) plus one
layer's K/V of the candidates; nothing per context token beyond the keys.

Where the encoding kept its residual stream entering l_c (ContextState.hidden: a first question's coarse pass keeps it
for the request, the document cache while a document waits for deepening), the pass starts there instead (`Streams`,
FastKV's token-selective propagation; the cascade's default, `first_from_stream`): the candidates and the query enter
layer l_c with the states the streaming prefill gave them, which saw the whole window, and only layers l_c..l_R run
over C. With C = the whole context this too is the streaming prefill at l_R (the layers below l_c are the same
computation), so the limit is unchanged.

Where the encoding also keeps the rows an earlier pass left (`RowMemo`, compressor/candidate_rows.py: each of its
candidates' K/V at layers l_c..l_R-1 and its l_R key), a pass from the stream runs only the candidates it does not
hold, and the held ones' K/V are read from there at every layer (an approximation, exact where the held rows saw
what they would see in this pass); each pass leaves its own rows for the next.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.chunk_attention import chunk_attention
from ..kernels.rope import rerotate
from ..models.llama import TruncatedLM
from .candidate_rows import CandidateRows, RowMemo
from .context_state import chunk_bounds
from .prefill_config import PrefillConfig


@dataclass(frozen=True)
class Streams:
    """Where a candidate pass starts when the encoding kept its stream: `layer` (the coarse layer l_c), the
    context's residual stream entering it (L, D) and each query's (Lq_i, D), in the model's dtype."""

    layer: int
    context: torch.Tensor
    queries: list[torch.Tensor]


@dataclass(frozen=True)
class _Group:
    """Rows [a, b) of the candidate pass that run as one chunk: the candidates of the context chunk that
    starts at `start` (or the query, at start = L), what each sees before itself (the sink, moved by
    `sink_shift`, then the non-sink rows [window, a)), and the DCA move of their l_R keys."""

    a: int
    b: int
    start: int
    window: int
    sink_shift: int
    key_shift: int
    first: bool  # the first chunk with candidates: it sees only itself
    before: int  # the non-sink rows it sees are [window, before) and then its own: a for candidates, C for a query


def _groups(candidates: torch.Tensor, n_queries: list[int], length: int, config: PrefillConfig) -> tuple[list[_Group], int]:
    """The chunks of the candidate pass, in order (each query a chunk of its own after the candidates, all at
    positions from L on, none seeing another), and how many candidates are the sink (positions < S)."""
    bounds = chunk_bounds(length, config)
    base = bounds[-2][0] if len(bounds) >= 2 else 0  # eq. 7 anchor
    starts = [start for start, _ in bounds] + [length]
    cuts = torch.searchsorted(candidates, torch.tensor(starts, device=candidates.device)).tolist()
    window_starts = [s - config.window if config.window else -1 for s in starts]  # no window: everything before
    lows = torch.searchsorted(candidates, torch.tensor(window_starts, device=candidates.device)).tolist()
    n_sink = int(torch.searchsorted(candidates, config.sink))
    groups: list[_Group] = []
    n_c = candidates.numel()
    for index, start in enumerate(starts[:-1]):
        a, b = cuts[index], cuts[index + 1]
        if a == b:
            continue
        sink_shift = (index - 1) * config.chunk if config.dca and index >= 2 else 0  # eq. 6
        key_shift = base - start if config.dca and index < len(bounds) - 2 else 0
        groups.append(_Group(a, b, start, max(n_sink, lows[index]), sink_shift, key_shift, not groups, a))
    index, first = len(bounds), not groups
    sink_shift = (index - 1) * config.chunk if config.dca and index >= 2 else 0
    a = n_c
    for n_query in n_queries:  # the queries: each after every candidate, none before another
        if n_query:
            groups.append(_Group(a, a + n_query, length, max(n_sink, lows[index]), sink_shift, 0, first, n_c))
        a += n_query
    return groups, n_sink


def candidate_prefill(model: TruncatedLM, context_ids: torch.Tensor, candidates: torch.Tensor,
                      query_ids: torch.Tensor, config: PrefillConfig, streams: Streams | None = None,
                      memo: RowMemo | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The streaming prefill of the candidates and the query through layers 1..l_R.

    context_ids: (L,) int64; candidates: (C,) int64 ascending context indices (the sink among them);
    query_ids: (Lq,) int64. Candidates are run in the context's own chunks, at their own positions,
    each seeing the sink and the candidates within the window before its chunk and of its chunk
    before it; DCA moves the sink (eq. 6) and the l_R keys (eq. 7) by each candidate's original
    chunk. Returns the l_R keys of the candidates (kv_heads, C, d) and the query states (heads, Lq, d).
    Layer by layer over all C candidates at once: the projections and the MLP run on row blocks of
    `config.chunk` (the same matrix shapes as the streaming prefill's and from one request to the next,
    so the CPU's kernel cache keeps them), the attention chunk by chunk. `streams`: start at layer
    streams.layer from the kept residual streams instead of at layer 1 from the ids. `memo`: as in
    `candidate_prefill_many`.
    """
    keys, (queries,) = candidate_prefill_many(model, context_ids, candidates, [query_ids], config, streams, memo)
    return keys, queries


def candidate_prefill_many(model: TruncatedLM, context_ids: torch.Tensor, candidates: torch.Tensor,
                           queries_ids: list[torch.Tensor], config: PrefillConfig, streams: Streams | None = None,
                           memo: RowMemo | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """`candidate_prefill` for several queries over one candidate set: the candidates run once, each query
    after them as in its own pass (at positions L.., seeing the sink, the last window's candidates and
    itself, no other query), in row blocks of its own, so each query's states equal its own pass's bit
    for bit. queries_ids: [(Lq_i,) int64] -> the l_R keys (kv_heads, C, d), [(heads, Lq_i, d)].
    streams: start at streams.layer (its queries in the order of queries_ids). memo: the context's rows
    (compressor/candidate_rows.py); the pass leaves its own there (layers memo.layer..l_R-1), and one from the
    stream runs only the candidates the memo does not hold (`memo.reused`: how many it held)."""
    length, device, l_r = context_ids.numel(), model.device, model.n_layers
    candidates = candidates.to(device)
    lengths = [q.numel() for q in queries_ids]
    n_c, n_q = candidates.numel(), sum(lengths)
    groups, n_sink = _groups(candidates, lengths, length, config)
    positions = torch.cat([candidates] + [torch.arange(length, length + n, device=device) for n in lengths])
    cos, sin = model.rope(positions)
    first = 1 if streams is None else streams.layer
    held = memo.usable(first, l_r) if memo is not None and streams is not None else None
    plan = _Plan.of(candidates, groups, n_q, held)
    if memo is not None:
        memo.reused = n_c - plan.n_run_c
    run_c = candidates if plan.run is None else candidates[plan.run[:plan.n_run_c]]
    if streams is None:
        h = model.embed(torch.cat([context_ids.to(device)[run_c]] + [q.to(device) for q in queries_ids]))
    else:
        h = torch.cat([streams.context[run_c]] + list(streams.queries))
    if plan.run is not None:
        cos, sin = cos[plan.run], sin[plan.run]
    ends = torch.tensor([0] + lengths).cumsum(0).tolist()
    query_blocks = [(plan.n_run_c + a, plan.n_run_c + b) for a, b in zip(ends[:-1], ends[1:])]
    blocks = [(i, min(i + config.chunk, plan.n_run_c)) for i in range(0, plan.n_run_c, config.chunk)] + query_blocks
    spec = model.spec
    recorded: list[tuple[torch.Tensor, torch.Tensor]] = []
    for l in range(first, l_r):
        layer = model.layer(l)
        n_run = h.shape[0]
        q = torch.empty(spec.num_heads, n_run, spec.head_dim, dtype=model.dtype, device=device)
        k, v = (torch.empty(spec.num_kv_heads, n_run, spec.head_dim, dtype=model.dtype, device=device)
                for _ in range(2))
        for a, b in blocks:
            if b > a:
                q[:, a:b], k[:, a:b], v[:, a:b] = layer.qkv(h[a:b], cos[a:b], sin[a:b])
        if plan.run is not None:  # every row's K/V: this pass's, and the memo's for the rows it holds
            k, v = plan.scatter(k, held.keys[l - held.first]), plan.scatter(v, held.values[l - held.first])
        if memo is not None and l >= memo.layer:
            recorded.append((k[:, :n_c], v[:, :n_c]))
        out = torch.empty_like(q)
        moved: dict[int, torch.Tensor] = {}  # the sink's keys by DCA shift
        for g, rows in zip(groups, plan.rows):
            if rows is None:  # none of its rows runs here
                continue
            s0, s1, some = rows
            if g.first:
                seen_k, seen_v, n_prefix = k[:, g.a:g.b], v[:, g.a:g.b], 0
            else:
                if g.sink_shift not in moved:
                    moved[g.sink_shift] = rerotate(k[:, :n_sink], model.inv_freq, g.sink_shift)
                seen_k = torch.cat((moved[g.sink_shift], k[:, g.window:g.before], k[:, g.a:g.b]), dim=1)
                seen_v = torch.cat((v[:, :n_sink], v[:, g.window:g.before], v[:, g.a:g.b]), dim=1)
                n_prefix = n_sink + g.before - g.window
            out[:, s0:s1] = chunk_attention(q[:, s0:s1], seen_k, seen_v, n_prefix, rows=some)
        del q, k, v, moved
        for a, b in blocks:  # rows are independent here: each block overwrites its own
            if b > a:
                h[a:b] = layer.finish(h[a:b], out[:, a:b])
        del out
    top = model.layer(l_r)
    keys = torch.empty(spec.num_kv_heads, plan.n_run_c, spec.head_dim, dtype=model.dtype, device=device)
    for a, b in blocks[:-len(query_blocks)] if query_blocks else blocks:
        keys[:, a:b] = top.keys(h[a:b], cos[a:b], sin[a:b])
    if plan.run is not None:
        keys = plan.scatter(keys, held.top, rows=n_c)
    if memo is not None and recorded and n_c:
        memo.rows = CandidateRows(candidates.clone(), memo.layer, l_r, torch.stack([k for k, _ in recorded]),
                                  torch.stack([v for _, v in recorded]), keys.clone())
    for g in groups:
        if g.key_shift and g.a < n_c:
            keys[:, g.a:g.b] = rerotate(keys[:, g.a:g.b], model.inv_freq, g.key_shift)
    return keys, [top.queries(h[a:b], cos[a:b], sin[a:b]) for a, b in query_blocks]


@dataclass(frozen=True)
class _Plan:
    """Which rows of a candidate pass run (the rest are read from a memo's rows). `run`: (R,) int64 the rows that
    run, ascending (the candidates not held, then every query row), None when all run; `n_run_c`: how many of them
    are candidates; `found`: (H,) the candidate rows held, `source`: (H,) their rows in the memo; `rows`, per group:
    None when none of its rows runs, else (s0, s1, some): its running rows are [s0, s1) of the running rows, and
    `some` (R_g,) their places in the group where only some of its rows run (None: all of them)."""

    run: torch.Tensor | None
    n_run_c: int
    found: torch.Tensor | None
    source: torch.Tensor | None
    rows: list[tuple[int, int, torch.Tensor | None] | None]

    @classmethod
    def of(cls, candidates: torch.Tensor, groups: list[_Group], n_q: int, held: CandidateRows | None) -> "_Plan":
        """The plan of a pass over `candidates` (C,) in `groups` with `n_q` query rows, reading the rows `held` has."""
        n_c = candidates.numel()
        where = held.find(candidates) if held is not None else None
        if where is None or not bool((where >= 0).any()):
            return cls(None, n_c, None, None, [(g.a, g.b, None) for g in groups])
        fresh = where < 0
        run = torch.cat((fresh.nonzero().squeeze(1), torch.arange(n_c, n_c + n_q, device=candidates.device)))
        found = (~fresh).nonzero().squeeze(1)
        place = torch.cat((fresh.long().cumsum(0), n_c - found.numel() + 1 + torch.arange(n_q, device=candidates.device)))
        runs = torch.cat((fresh, torch.ones(n_q, dtype=torch.bool, device=candidates.device)))
        rows: list[tuple[int, int, torch.Tensor | None] | None] = []
        for g in groups:
            mine = runs[g.a:g.b]
            count = int(mine.sum())
            if count == 0:
                rows.append(None)
                continue
            s1 = int(place[g.b - 1])
            rows.append((s1 - count, s1, None if count == g.b - g.a else mine.nonzero().squeeze(1)))
        return cls(run, int(fresh.sum()), found, where[found], rows)

    def scatter(self, computed: torch.Tensor, memo: torch.Tensor, rows: int | None = None) -> torch.Tensor:
        """computed: (h, R, d) the running rows' -> (h, rows, d) every row's (default: all of them), the held
        candidates' from memo (h, M, d)."""
        n = self.run.numel() + self.found.numel() if rows is None else rows
        out = torch.empty(computed.shape[0], n, computed.shape[2], dtype=computed.dtype, device=computed.device)
        run = self.run if rows is None else self.run[:self.n_run_c]
        out[:, run] = computed
        out[:, self.found] = memo[:, self.source]
        return out

