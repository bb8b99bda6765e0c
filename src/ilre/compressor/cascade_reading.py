"""The cascade's reading plan: a shallow layer's attention picks candidates, which run on to l_R for the scorer.

How it reads (the scorer, e.g. the cascade's own l_R-and-coarse blend, compressor/strategies/cascade.py, only scores
and allocates): what it encodes (the coarse layer's keys only), how it picks candidates (`pick_candidates`), how it
ranks them (the candidates run on to l_R from the stream the coarse pass left entering l_c, or from layer 1:
compressor/candidate_prefill.py); where its candidates would cover the context it reads the context whole, as it
does on a document encoded in full (`deepened`, the scorer's whole-context form). When l_R finds nothing it attends
to strongly among the candidates (`deepen_below`: the coarse layer, which matches surface forms, missed what the
query asks, e.g. a question that paraphrases the document), or when the coarse layer itself attends to nothing
strongly (`coarse_below`, checked before the candidate pass), the whole context runs to l_R instead: the deepened
form, on an encoding the caller may supply and keep (QueryPass.deepened; the engine and the pipeline's `select`
resume it from the coarse encoding, so layers 1..l_c run once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..kernels.query_scores import blend_layers, query_key_scores
from .allocation import PoolingAllocator
from .candidate_prefill import Streams, candidate_prefill, candidate_prefill_many
from .prefill import encode_context, prefill_query
from .prefill_config import PrefillConfig
from .reading import QueryPass, Reading, Scorer

DEFAULT_CANDIDATES = 4.0  # candidates per budget token when neither the request nor the profile says
FIRST_STREAM_TOKENS = 131072  # the longest context whose first question keeps the coarse stream (L x D) for its candidates
PEAK_TOKENS = 5  # how many of l_R's strongest candidates `peak_strength` averages


def peak_strength(scores: torch.Tensor, top: int = PEAK_TOKENS) -> float:
    """scores: (C,) l_R's A^C over the candidates outside the sink -> the mean of the `top` largest
    (all of them when fewer; 0.0 when none): how strongly l_R attends to what it finds there."""
    if scores.numel() == 0:
        return 0.0
    return float(scores.topk(min(top, scores.numel())).values.mean())


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


@dataclass(frozen=True)
class CascadeReading(Reading):
    """The cascade's plan around `scorer`. coarse_layer: l_c < l_R, whose query attention over the whole context
    picks the candidates; candidates: how many per budget token; deepen_below, deepen_blend, coarse_below: the
    fallback's thresholds and blend (in [0, 1], 0 = never / none; the cascade's options, compressor/strategies/
    cascade.py); first_from_stream: whether a first question's candidates run on from the coarse pass's stream;
    allocator: Algorithm 1 for picking the candidates; deep: the scorer on the whole context (its deepened form)."""

    coarse_layer: int = 1
    candidates: float = DEFAULT_CANDIDATES
    deepen_below: float = 0.0
    deepen_blend: float = 0.0
    coarse_below: float = 0.0
    first_from_stream: bool = True
    allocator: PoolingAllocator = field(default_factory=lambda: PoolingAllocator((2, 4, 8), tuple(range(1, 17))))
    deep: Scorer | None = None

    def attention(self, query: QueryPass) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """A^C (L,) at l_R over the candidates (zero elsewhere) and the coarse layer's over all: the coarse
        layer's attention picks the candidates, which run to l_R with the query."""
        coarse = self.coarse_layer
        scores, candidates = self._candidates(query, coarse)
        if candidates is None:  # the coarse layer found nothing: depth at once
            return self._whole_context(query, coarse)
        keys, queries = candidate_prefill(query.model, query.context_ids, candidates, query.query_ids, query.config,
                                          self._streams([query], coarse), query.rows)
        return self._ranked(query, coarse, scores, candidates, query_key_scores(queries, keys))

    def attention_many(self, passes: list[QueryPass]) -> list[tuple[torch.Tensor | None, torch.Tensor | None]]:
        """Several questions share one candidate pass: the union U of their candidates runs to l_R once, each
        question after it as in its own pass, and each is ranked over U (as `query_attention` ranks its own
        candidates: a question's candidate set is U). When U would cost more than reading the whole context on
        from the coarse layer (`deep_pays`), every question is scored as `deepened()` scores it instead, on
        that one encoding (QueryPass.deepened). measured: `candidates` = |U|, `deep` = 1 when the whole
        context was read."""
        coarse = self.coarse_layer
        if len(passes) < 2:
            return [self.attention(query) for query in passes]
        picked = [self._candidates(query, coarse) for query in passes]
        shared = [i for i, (_, candidates) in enumerate(picked) if candidates is not None]
        union = torch.unique(torch.cat([picked[i][1] for i in shared])) if shared else None
        first = passes[0]
        if union is None or self.deep_pays(first.context_ids.numel(), union.numel(), first.model.n_layers):
            shared = []  # every question reads the whole context (one encoding, made once)
        ranked: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        if shared:
            keys, queries = candidate_prefill_many(first.model, first.context_ids, union,
                                                   [passes[i].query_ids for i in shared], first.config,
                                                   self._streams([passes[i] for i in shared], coarse), first.rows)
            for i, query_states in zip(shared, queries):
                passes[i].measured["candidates"] = float(union.numel())
                ranked[i] = self._ranked(passes[i], coarse, picked[i][0], union, query_key_scores(query_states, keys))
        return [ranked[i] if i in ranked else self._whole_context(query, coarse) for i, query in enumerate(passes)]

    @staticmethod
    def _streams(passes: list[QueryPass], coarse: int) -> Streams | None:
        """Where the candidate pass starts: at the coarse layer from the kept streams where the encoding kept the
        context's (measured: `from_layer`), else None (at layer 1, from the ids)."""
        first = passes[0]
        if first.stream is None or max(first.retrieval.keys) != coarse or any(p.retrieval.stream is None for p in passes):
            return None
        for query in passes:
            query.measured["from_layer"] = float(coarse)
        return Streams(coarse, first.stream, [query.retrieval.stream for query in passes])

    def _candidates(self, query: QueryPass, coarse: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The coarse layer's A^C (L,) and the candidates it picks (C,) ascending; None when `coarse_below`
        sends the query to the whole context (measured: `coarse_peak`)."""
        if query.context_ids is None:
            raise ValueError(f"context_ids: {self.scorer.name} runs its candidates again and needs the context's ids")
        retrieval, config = query.retrieval, query.config
        scores = query_key_scores(retrieval.queries[coarse], retrieval.keys[coarse])  # (L,)
        query.measured["coarse_peak"] = coarse_peak = peak_strength(scores[config.sink:])
        if self.coarse_below and coarse_peak < self.coarse_below:
            return scores, None
        count = self.candidate_count(query.budget)
        return scores, pick_candidates(scores, count, config.sink, recent_share(count, config), self.allocator)

    def _ranked(self, query: QueryPass, coarse: int, scores: torch.Tensor, candidates: torch.Tensor,
                over: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """l_R's A^C over the candidates `over` (C,) spread to (L,) (zero elsewhere) and the coarse layer's
        `scores` (L,); the whole context's instead when `deepen_below` finds l_R's peak too weak
        (measured: `peak`)."""
        config = query.config
        query.measured["peak"] = peak = peak_strength(over[candidates >= config.sink])
        attention = torch.zeros(scores.numel(), device=scores.device)
        attention[candidates] = over
        if self.deepen_below and peak < self.deepen_below:
            whole, coarse_all = self._whole_context(query, coarse)
            if self.deepen_blend:
                whole = blend_layers(whole, [attention], self.deepen_blend, config.sink)
            return whole, coarse_all
        return attention, scores

    def _whole_context(self, query: QueryPass, coarse: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A^C (L,) at l_R and at the coarse layer, both over every token: the query against the whole
        context encoded as `deepened()` reads it (the caller's, else encoded here; measured: `deep`)."""
        deep, model = self.deep, query.model
        query.measured["deep"] = 1.0
        if query.deepened is not None:
            state = query.deepened()
        else:
            state = encode_context(model, query.context_ids, query.config, deep.encoded_layers(model.n_layers),
                                   parts=deep.context_parts)
        retrieval = prefill_query(model, state, query.query_ids, deep.query_parts)
        return (query_key_scores(retrieval.queries[model.n_layers], retrieval.keys[model.n_layers]),
                query_key_scores(retrieval.queries[coarse], retrieval.keys[coarse]))

    def encoded_layers(self, l_r: int) -> tuple[int, ...]:
        """The coarse layer alone (its candidates run to l_R per query)."""
        if self.coarse_layer >= l_r:
            raise ValueError(f"coarse_layer: must be below l_R = {l_r}, the layer that ranks the candidates "
                             f"(got {self.coarse_layer})")
        return (self.coarse_layer,)

    @property
    def context_parts(self) -> tuple[str, ...]:
        return ()

    @property
    def query_parts(self) -> tuple[str, ...]:
        return ()

    @property
    def falls_back(self) -> bool:
        return bool(self.deepen_below or self.coarse_below)

    def streams_first(self, length: int) -> bool:
        """Whether a first question over `length` tokens starts its candidates from the coarse pass's stream."""
        return self.first_from_stream and length <= FIRST_STREAM_TOKENS

    def deep_pays(self, length: int, candidates: int, l_r: int) -> bool:
        """Whether reading the whole context on from the coarse layer ((l_R - l_c) x L layer-tokens) costs no
        more than one candidate pass over `candidates` tokens (l_R x C)."""
        return l_r * candidates >= (l_r - self.coarse_layer) * length

    def reads_deep(self, length: int, budget: int, queries: int, l_r: int) -> bool:
        """A fallback, or several questions whose candidates could together cost more than the deep pass."""
        if self.falls_back:
            return True
        return queries >= 2 and self.deep_pays(length, min(length, queries * self.candidate_count(budget)), l_r)

    def candidate_count(self, budget: int) -> int:
        """Candidates for a budget of `budget` context tokens."""
        return math.ceil(self.candidates * budget)

    def for_context(self, length: int, budget: int) -> Reading:
        """The deepened form's plain reading when the candidates would be the whole context."""
        if self.candidate_count(budget) >= length:
            return self.deep.reading()
        return self

    def deepened(self) -> Scorer:
        """Every token a candidate: the limit the candidate stage approximates (for the cascade: ILRe at l_R with
        the coarse layer at coarse_weight, stage 18 of the results page)."""
        return self.deep
