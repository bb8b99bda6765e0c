"""One compression: token ids in, kept context indices out (the data path of the design).

`select_context` runs one request as two steps: `encode_context` (the query-independent prefill
of the context) and `select_query` (the query chunk, scores, allocation), so an encoded context can
serve several queries. `select_contexts` runs many requests, sending those whose context is a
single prefill chunk through one batched prefill (compressor/batched_prefill.py) and the rest one
by one. Scores and allocations stay on the model's device; only the kept indices come back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from ..models.llama import TruncatedLM
from .batched_prefill import batched_prefill, fits_one_chunk
from .context_state import ContextState, RetrievalState, score_keys
from .prefill import encode_context, prefill_query, resume_context
from .prefill_config import PrefillConfig
from .reading import QueryPass, Reading
from .strategies import ScoreInputs, Strategy
from .unit_selection import select_units
from .units import Units


@dataclass
class Selection:
    """kept: (B,) int64 ascending indices into the context, on the CPU; timings_ms: per stage;
    passthrough: True when the context already fit the budget and nothing ran; scores: the
    strategy's (L,) scores, left where they were computed (the explanation view reads them);
    prefill_shared: how many requests one batched prefill served with this one (1: its own);
    measured: what the strategy measured on the way (QueryPass.measured, e.g. the cascade's `peak`)."""

    kept: torch.Tensor
    timings_ms: dict[str, float] = field(default_factory=dict)
    passthrough: bool = False
    scores: torch.Tensor | None = None
    prefill_shared: int = 1
    measured: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SelectionJob:
    """One request of `select_contexts`: context_ids (L,), query_ids (Lq,) int64, its budget and strategy;
    units: the context's units (compressor/units.py) to keep whole units, None = single tokens."""

    context_ids: torch.Tensor
    query_ids: torch.Tensor
    budget: int
    strategy: Strategy
    units: Units | None = None


def select_context(
    model: TruncatedLM | None,
    context_ids: torch.Tensor,
    query_ids: torch.Tensor,
    budget: int,
    strategy: Strategy,
    config: PrefillConfig,
    units: Units | None = None,
    encodings: "Encodings | None" = None,
) -> Selection:
    """Choose at most `budget` context tokens for the query: encode_context, then `select_query`.

    context_ids: (L,) int64, query_ids: (Lq,) int64. The first S (sink) tokens are always kept
    and count against the budget; the strategy allocates the other budget - S among the rest.
    `model` may be None for strategies that do not need attention.
    `units`: the context's units (compressor/units.py): whole units are kept (compressor/unit_selection.py).
    `encodings`: where the encoded contexts come from (a document cache: `Encodings`); None = encoded here.
    """
    return select_context_queries(model, context_ids, [query_ids], budget, strategy, config, units, encodings)[0]


class Encodings(Protocol):
    """Where one request's encoded contexts come from (the pipeline asks, the owner decides: a document cache,
    or `FreshEncodings`): the one its strategy reads, and the deeper one its strategy's `deepened()` form
    reads when a query falls back. Each is made at most once per request."""

    def encoded(self) -> ContextState:
        """The context encoded as the request's strategy reads it."""

    def deepened(self) -> ContextState:
        """The context encoded as the strategy's `deepened()` form reads it (asked only when a query needs it)."""

    def stream(self) -> torch.Tensor | None:
        """The residual stream (L, D) entering the encoding's top layer where the questions' candidates start there
        (compressor/candidate_prefill.Streams: a first question's where `Reading.streams_first`, a document cache's
        later questions'); None: they start at layer 1."""


class OnceEncodings:
    """`Encodings` made on first ask (`_make_encoded`, `_make_deepened`) and kept for the request in attributes.
    Not in closures over self: those make every request's encodings a reference cycle, which only Python's cycle
    collector frees, late, and every tensor they hold with them (a worker under a flood held 1.3 GiB of
    document states against its 1 GiB cache)."""

    _encoded: ContextState | None = None
    _deepened: ContextState | None = None

    def encoded(self) -> ContextState:
        if self._encoded is None:
            self._encoded = self._make_encoded()
        return self._encoded

    def deepened(self) -> ContextState:
        if self._deepened is None:
            self._deepened = self._make_deepened()
        return self._deepened

    def stream(self) -> torch.Tensor | None:
        return None

    def _make_encoded(self) -> ContextState:
        raise NotImplementedError

    def _make_deepened(self) -> ContextState:
        raise NotImplementedError


class FreshEncodings(OnceEncodings):
    """Encodings made now and kept for this request only: the plan's encoding keeps its resume point when
    the questions may read the deep encoding (Reading.reads_deep), which is then taken on from there
    (layers 1..l_c not run again), else encoded from the start."""

    def __init__(self, model: TruncatedLM, context_ids: torch.Tensor, config: PrefillConfig, plan: Reading,
                 n_queries: int, budget: int):
        self.model, self.context_ids, self.config, self.plan = model, context_ids, config, plan
        self.n_queries, self.budget = n_queries, budget
        self._resume: Callable[[], ContextState] | None = None
        self._stream: torch.Tensor | None = None

    def _make_encoded(self) -> ContextState:
        model, plan, length = self.model, self.plan, self.context_ids.numel()
        streamed = plan.streams_first(length)
        keep = streamed or plan.reads_deep(length, self.budget, self.n_queries, model.n_layers)
        state = encode_context(model, self.context_ids, self.config, plan.encoded_layers(model.n_layers),
                               parts=plan.context_parts, keep_hidden=keep)
        if state.hidden is not None:  # taken off the state (no rows memo for one request): the resume point, the stream
            self._stream = state.hidden if streamed else None
            self._resume = resumed(model, state, plan.deepened())
        return state

    def stream(self) -> torch.Tensor | None:
        return self._stream

    def _make_deepened(self) -> ContextState:
        if self._resume is not None:
            return self._resume()
        deep = self.plan.deepened().reading()
        return encode_context(self.model, self.context_ids, self.config, deep.encoded_layers(self.model.n_layers),
                              parts=deep.context_parts)


def select_context_queries(model: TruncatedLM | None, context_ids: torch.Tensor, queries_ids: list[torch.Tensor],
                           budget: int, strategy: Strategy, config: PrefillConfig, units: Units | None = None,
                           encodings: Encodings | None = None) -> list[Selection]:
    """`select_context` for several queries of one context: one encoding, then `select_queries` (which lets the
    strategy share work between the queries). queries_ids: [(Lq_i,) int64] -> one Selection per query.
    `encodings`: where the encoded contexts come from (None: `FreshEncodings`, made here for this request)."""
    length = context_ids.numel()
    if length <= budget:
        return [Selection(torch.arange(length), passthrough=True) for _ in queries_ids]
    plan = strategy.reading()
    if model is not None:
        plan.encoded_layers(model.n_layers)  # the options against l_R, before they are resolved for the length
    plan = plan.for_context(length, budget)
    strategy = plan.scorer
    if not strategy.needs_attention:
        return [score_and_allocate(None, None, length, budget, strategy, config.sink, {}, units=units)
                for _ in queries_ids]
    if model is None:
        raise ValueError(f"strategy: {strategy.name} needs a model")
    clock = time.perf_counter()
    encodings = encodings or FreshEncodings(model, context_ids, config, plan, len(queries_ids), budget)
    with torch.inference_mode():
        state = encodings.encoded()
    deepened = encodings.deepened if plan.deepened() is not None else None
    return select_queries(model, state, queries_ids, budget, strategy, {"prefill": _lap(clock)}, context_ids, units,
                          deepened, encodings.stream())


def resumed(model: TruncatedLM, state: ContextState, deep: Strategy, take: bool = True) -> Callable[[], ContextState]:
    """The encoding `deep` (a deepened scorer) reads, taken on from `state` (encoded with keep_hidden, whose resume point it takes
    unless `take` is False: a document cache that keeps the stream with the encoding) on first call and kept:
    layers 1..state.top are not run again (prefill.resume_context)."""
    hidden = state.take_hidden() if take else state.hidden
    shallow = ContextState(state.length, state.n_chunks, state.config, state.keys, state.caches, hidden=hidden,
                           resume=state.resume)
    plan = deep.reading()
    return once(lambda: resume_context(model, shallow, plan.encoded_layers(model.n_layers), plan.context_parts))


def once(make: Callable[[], ContextState]) -> Callable[[], ContextState]:
    """`make`, run on the first call only; later calls return what it made."""
    made: list[ContextState] = []

    def first() -> ContextState:
        if not made:
            made.append(make())
        return made[0]

    return first


def select_query(model: TruncatedLM, state: ContextState, query_ids: torch.Tensor, budget: int, strategy: Strategy,
           timings: dict[str, float] | None = None, context_ids: torch.Tensor | None = None,
           units: Units | None = None, deepened: Callable[[], ContextState] | None = None,
           stream: torch.Tensor | None = None) -> Selection:
    """The query-dependent part: the query chunk against an encoded context, scoring, allocation.
    Any number of queries may be selected from one ContextState, one after another; `timings`
    (ms so far, e.g. the context's "prefill") are carried into the Selection; their "prefill" grows by the
    query pass and what the strategy runs to get its attention (a cascade's candidates, which need the
    context's ids (L,)). `units`: the context's units to keep whole (None: single tokens); `deepened`: as
    in `select_context`; `stream`: the state's residual stream entering its top layer (ContextState.hidden), where
    a cascade's candidates are to start there (Encodings.stream)."""
    return select_queries(model, state, [query_ids], budget, strategy, timings, context_ids, units, deepened,
                          stream)[0]


def select_queries(model: TruncatedLM, state: ContextState, queries_ids: list[torch.Tensor], budget: int,
                   strategy: Strategy, timings: dict[str, float] | None = None, context_ids: torch.Tensor | None = None,
                   units: Units | None = None, deepened: Callable[[], ContextState] | None = None,
                   stream: torch.Tensor | None = None) -> list[Selection]:
    """`select_query` for several queries against one encoded context, the queries' strategy work shared
    (Reading.attention_many: a cascade's questions share one candidate pass). Each Selection's
    "prefill" timing is the context's plus the queries' shared pass. `deepened` (run at most once) defaults to
    the strategy's `deepened()` form encoded here when a query first needs it; `stream`: as in `select_query`."""
    if state.length <= budget:
        return [Selection(torch.arange(state.length), dict(timings or {}), passthrough=True) for _ in queries_ids]
    plan = strategy.reading()
    missing = set(plan.context_parts) - set(state.parts)
    if missing:
        raise ValueError(f"strategy: {strategy.name} needs {sorted(missing)} that the encoded context lacks")
    lacking = set(plan.encoded_layers(model.n_layers)) - set(state.keys)
    if lacking:
        raise ValueError(f"strategy: {strategy.name} reads layers {sorted(lacking)} that the encoded context lacks")
    if not strategy.needs_query:  # scores from the context alone: computed once, memoised on the state
        return [score_and_allocate(model, RetrievalState(score_keys(model, state), {}, dict(state.parts)), state.length, budget,
                                    strategy, state.config.sink, dict(timings or {}), memo=state.scores, units=units)
                for _ in queries_ids]
    deep = plan.deepened().reading() if plan.deepened() is not None else None
    if deepened is None and deep is not None and context_ids is not None:
        deepened = once(lambda: encode_context(model, context_ids, state.config, deep.encoded_layers(model.n_layers),
                                               parts=deep.context_parts))
    elif deepened is not None:
        deepened = once(deepened)
    clock = time.perf_counter()
    with torch.inference_mode():
        rows = state.row_memo()
        passes = [QueryPass(model, prefill_query(model, state, query_ids, plan.query_parts), context_ids, query_ids,
                            budget, state.config, deepened, stream=stream, rows=rows) for query_ids in queries_ids]
        attentions = plan.attention_many(passes)
    spent = _lap(clock)
    selections = []
    for query, (attention, coarse) in zip(passes, attentions):
        own = dict(timings or {})
        own["prefill"] = round(own.get("prefill", 0.0) + spent, 3)
        selection = score_and_allocate(model, query.retrieval, state.length, budget, strategy, state.config.sink, own,
                                        attention=attention, coarse=coarse, units=units)
        selection.measured = query.measured
        selections.append(selection)
    return selections


def select_contexts(model: TruncatedLM | None, jobs: list[SelectionJob], config: PrefillConfig,
                    batch_tokens: int,
                    done: Callable[[int, Selection], None] | None = None) -> list[Selection]:
    """`select_context` for every job, equal to running them one by one. With batch_tokens > 0,
    jobs that need attention and whose context is one chunk are prefilled together, longest first,
    in groups of at most `batch_tokens` padded context tokens (their "prefill" timing is their
    group's, plus what each strategy runs for its own attention, e.g. a cascade's candidates); the other jobs
    run one by one. `done(i, selection)` is called as each job finishes."""
    out: list[Selection | None] = [None] * len(jobs)

    def finished(i: int, selection: Selection) -> None:
        out[i] = selection
        if done is not None:
            done(i, selection)

    plans = [job.strategy.reading().for_context(job.context_ids.numel(), job.budget) for job in jobs]
    kinds: dict[tuple[tuple[int, ...], bool], list[int]] = {}  # a batch's members encode the same layers
    for i, job in enumerate(jobs):
        length = job.context_ids.numel()
        if batch_tokens > 0 and model is not None and joins_a_batch(length, job.budget, plans[i], config):
            kind = (plans[i].encoded_layers(model.n_layers), plans[i].streams_first(length))
            kinds.setdefault(kind, []).append(i)
    for (layers, streamed), short in kinds.items():
        short.sort(key=lambda i: jobs[i].context_ids.numel())
        while short:
            longest = jobs[short[-1]].context_ids.numel()
            group = short[-max(1, batch_tokens // longest):]  # the longest ones, as many as fit
            del short[-len(group):]
            _select_batched(model, [jobs[i] for i in group], [plans[i] for i in group], config, layers, streamed,
                            lambda k, selection, group=group: finished(group[k], selection))
    for i, job in enumerate(jobs):
        if out[i] is None:
            finished(i, select_context(model, job.context_ids, job.query_ids, job.budget, job.strategy, config,
                                       units=job.units))
    return out  # type: ignore[return-value]


def _select_batched(model: TruncatedLM, jobs: list[SelectionJob], plans: list[Reading], config: PrefillConfig,
                    layers: tuple[int, ...], streamed: bool, finished: Callable[[int, Selection], None]) -> None:
    """One batched prefill of one-chunk jobs that encode `layers` (their first questions' candidates from the
    streams it keeps where `streamed`), then each job's own attention, scores and allocation."""
    clock = time.perf_counter()
    with torch.inference_mode():
        states = batched_prefill(model, [job.context_ids for job in jobs], [job.query_ids for job in jobs], config,
                                 layers, keep_streams=streamed)
    prefill_ms = _lap(clock)
    for k, (job, plan, state) in enumerate(zip(jobs, plans, states)):
        clock = time.perf_counter()
        query = QueryPass(model, state, job.context_ids, job.query_ids, job.budget, config, stream=state.context_stream)
        with torch.inference_mode():
            attention, coarse = plan.attention(query)
        selection = score_and_allocate(model, state, job.context_ids.numel(), job.budget, plan.scorer, config.sink,
                                       {"prefill": round(prefill_ms + _lap(clock), 3)}, attention=attention,
                                       coarse=coarse, units=job.units)
        selection.prefill_shared, selection.measured = len(jobs), query.measured
        finished(k, selection)


def joins_a_batch(length: int, budget: int, plan: Reading, config: PrefillConfig) -> bool:
    """Whether a one-query request of `length` context tokens goes through the batched prefill (when batching
    is on): its reading plan takes it, its context is one prefill chunk and longer than the budget."""
    return plan.batchable and budget < length and fits_one_chunk(length, config)


def score_and_allocate(model: TruncatedLM | None, state: RetrievalState | None, length: int, budget: int, strategy: Strategy,
            sink: int, timings: dict[str, float], memo: dict[str, torch.Tensor] | None = None,
            attention: torch.Tensor | None = None, coarse: torch.Tensor | None = None,
            units: Units | None = None) -> Selection:
    """Score (`attention`: the query's A^C (L,) from `Strategy.query_attention`, None for a query-agnostic
    strategy; `coarse`: a cascade's A^C at its coarse layer) and allocate: the sink + budget - S tokens, or with `units`,
    as many tokens in whole units around the strategy's own choice. `memo`: where a
    query-agnostic strategy's scores for this context are kept between queries."""
    clock = time.perf_counter()
    with torch.inference_mode():
        scores = memo.get(strategy.memo_key) if memo is not None else None
        if scores is None:
            scores = strategy.score(ScoreInputs(length=length, attention=attention, state=state, sink=sink, budget=budget,
                                                coarse_attention=coarse))
            if memo is not None:
                memo[strategy.memo_key] = scores
        timings["score"] = _lap(clock)
        clock = time.perf_counter()
        kept = strategy.select(scores, budget, sink)
        if units is not None:
            kept = select_units(scores, units.bounds, kept, sink, units.heads)
        kept = kept.cpu()
        timings["allocate"] = _lap(clock)
    return Selection(kept, timings, scores=scores)


def _lap(start: float) -> float:
    return round((time.perf_counter() - start) * 1000.0, 3)
