"""One compression: token ids in, kept context indices out (the data path of the design).

`select` runs one request (a SelectionJob: the context, its questions, the budget, the strategy, where its
encodings come from) in two steps: the context's query-independent encoding (once, `Encodings`), then for its
questions the query chunk, the reading plan's attention (compressor/reading.py), scores and allocation.
`select_batch` runs many one-question requests, sending those whose context is a single prefill chunk through one
batched prefill (compressor/batched_prefill.py) and the rest one by one. Scores and allocations stay on the
model's device; only the kept indices come back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

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
    """One selection request: context_ids (L,) int64 and its questions queries_ids [(Lq_i,) int64], the budget (context
    tokens to keep, sink included) and the strategy; units: the context's units (compressor/units.py) to keep whole
    units, None = single tokens; encodings: where its encoded contexts come from (a document cache's, or a context
    already encoded: `FreshEncodings(..., encoded=state)`); None = encoded here for this request."""

    context_ids: torch.Tensor
    queries_ids: Sequence[torch.Tensor]
    budget: int
    strategy: Strategy
    units: Units | None = None
    encodings: "Encodings | None" = None


class Encodings(Protocol):
    """Where one request's encoded contexts come from (the pipeline asks, the owner decides: a document cache,
    or `FreshEncodings`): the one its reading plan reads, and the deeper one the plan's `deepened()` form
    reads when a query falls back. Each is made at most once per request."""

    def encoded(self) -> ContextState:
        """The context encoded as the request's plan reads it."""

    def deepened(self) -> ContextState:
        """The context encoded as the plan's `deepened()` form reads it (asked only when a query needs it)."""

    def stream(self) -> torch.Tensor | None:
        """The residual stream (L, D) entering the encoding's top layer where the questions' candidates start there
        (compressor/candidate_prefill.Streams: a first question's where `Reading.streams_first`, a document cache's
        later questions'); None: they start at layer 1."""


class OnceEncodings:
    """`Encodings` made on first ask (`_make_encoded`, `_make_deepened`) and kept for the request in attributes: the
    one run-once mechanism of a request's encodings. Not in closures over self: those make every request's encodings
    a reference cycle, which only Python's cycle collector frees, late, and every tensor they hold with them (a worker
    under a flood held 1.3 GiB of document states against its 1 GiB cache)."""

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
    """Encodings kept for one request only. Made here: the plan's encoding keeps its resume point when the questions
    may read the deep encoding (Reading.reads_deep), which is then taken on from there (layers 1..l_c not run again),
    else encoded from the start. Or given: `encoded`, a context already encoded as the plan reads it, with its
    `stream` (Encodings.stream) and `deepened` (makes the deep encoding; None: encoded from the start when asked)."""

    def __init__(self, model: TruncatedLM, context_ids: torch.Tensor, config: PrefillConfig, strategy: Strategy,
                 budget: int, n_queries: int = 1, encoded: ContextState | None = None,
                 stream: torch.Tensor | None = None, deepened: Callable[[], ContextState] | None = None):
        self.model, self.context_ids, self.config = model, context_ids, config
        self.plan = strategy.reading().for_context(context_ids.numel(), budget)
        self.n_queries, self.budget = n_queries, budget
        self._encoded, self._stream, self._resume = encoded, stream, deepened

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
        resume, self._resume = self._resume, None
        if resume is not None:
            return resume()
        deep = self.plan.deepened().reading()
        return encode_context(self.model, self.context_ids, self.config, deep.encoded_layers(self.model.n_layers),
                              parts=deep.context_parts)


def resumed(model: TruncatedLM, state: ContextState, deep: Strategy, take: bool = True) -> Callable[[], ContextState]:
    """What makes the encoding `deep` (a deepened scorer) reads, taken on from `state` (encoded with keep_hidden, whose
    resume point it takes unless `take` is False: a document cache that keeps the stream with the encoding): layers
    1..state.top are not run again (prefill.resume_context). Run it once (OnceEncodings keeps what it made)."""
    hidden = state.take_hidden() if take else state.hidden
    shallow = ContextState(state.length, state.n_chunks, state.config, state.keys, state.caches, hidden=hidden,
                           resume=state.resume)
    plan = deep.reading()
    return lambda: resume_context(model, shallow, plan.encoded_layers(model.n_layers), plan.context_parts)


def select(model: TruncatedLM | None, job: SelectionJob, config: PrefillConfig) -> list[Selection]:
    """Choose at most `job.budget` context tokens for each of the job's questions -> one Selection per question.

    The first S (sink) tokens are always kept and count against the budget; the strategy allocates the other
    budget - S among the rest. The context is encoded once (`job.encodings`, read with the strategy's plan as it is;
    else here, with the plan as it runs on the context's length: Reading.for_context), then each question runs
    against it, the plan sharing work between them (Reading.attention_many: a cascade's questions share one candidate
    pass); each Selection's "prefill" timing is the context's plus the questions' shared pass. `model` may be None
    for strategies that do not need attention."""
    length, budget, queries = job.context_ids.numel(), job.budget, job.queries_ids
    if length <= budget:
        return [Selection(torch.arange(length), passthrough=True) for _ in queries]
    plan = job.strategy.reading()
    if job.encodings is None:  # else the plan their owner encoded them for, as it is
        if model is not None:
            plan.encoded_layers(model.n_layers)  # the options against l_R, before they are resolved for the length
        plan = plan.for_context(length, budget)
    scorer = plan.scorer
    if not scorer.needs_attention:
        return [score_and_allocate(ScoreInputs(length=length, sink=config.sink, budget=budget), scorer, {}, job.units)
                for _ in queries]
    if model is None:
        raise ValueError(f"strategy: {scorer.name} needs a model")
    clock = time.perf_counter()
    encodings = job.encodings or FreshEncodings(model, job.context_ids, config, scorer, budget, len(queries))
    with torch.inference_mode():
        state = encodings.encoded()
    timings = {"prefill": _lap(clock)}
    missing = set(plan.context_parts) - set(state.parts)
    if missing:
        raise ValueError(f"strategy: {scorer.name} needs {sorted(missing)} that the encoded context lacks")
    lacking = set(plan.encoded_layers(model.n_layers)) - set(state.keys)
    if lacking:
        raise ValueError(f"strategy: {scorer.name} reads layers {sorted(lacking)} that the encoded context lacks")
    if not scorer.needs_query:  # scores from the context alone: computed once, memoised on the state
        inputs = ScoreInputs(length=length, state=RetrievalState(score_keys(model, state), {}, dict(state.parts)),
                             sink=state.config.sink, budget=budget)
        return [score_and_allocate(inputs, scorer, dict(timings), job.units, memo=state.scores) for _ in queries]
    deepened = encodings.deepened if plan.deepened() is not None else None
    clock = time.perf_counter()
    with torch.inference_mode():
        rows = state.row_memo()
        passes = [QueryPass(model, prefill_query(model, state, query_ids, plan.query_parts), job.context_ids, query_ids,
                            budget, state.config, deepened, stream=encodings.stream(), rows=rows)
                  for query_ids in queries]
        attentions = plan.attention_many(passes)
    spent = _lap(clock)
    selections = []
    for query, (attention, coarse) in zip(passes, attentions):
        own = dict(timings)
        own["prefill"] = round(own["prefill"] + spent, 3)
        inputs = ScoreInputs(length=length, attention=attention, state=query.retrieval, sink=state.config.sink,
                             budget=budget, coarse_attention=coarse)
        selection = score_and_allocate(inputs, scorer, own, job.units)
        selection.measured = query.measured
        selections.append(selection)
    return selections


def select_batch(model: TruncatedLM | None, jobs: list[SelectionJob], config: PrefillConfig, batch_tokens: int,
                 done: Callable[[int, Selection], None] | None = None) -> list[Selection]:
    """`select` for every job of one question each (their own encodings), equal to running them one by one. With
    batch_tokens > 0, jobs that need attention and whose context is one chunk are prefilled together, longest first,
    in groups of at most `batch_tokens` padded context tokens (their "prefill" timing is their group's, plus what
    each plan runs for its own attention, e.g. a cascade's candidates); the other jobs run one by one.
    `done(i, selection)` is called as each job finishes."""
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
            finished(i, select(model, job, config)[0])
    return out  # type: ignore[return-value]


def _select_batched(model: TruncatedLM, jobs: list[SelectionJob], plans: list[Reading], config: PrefillConfig,
                    layers: tuple[int, ...], streamed: bool, finished: Callable[[int, Selection], None]) -> None:
    """One batched prefill of one-chunk jobs that encode `layers` (their first questions' candidates from the
    streams it keeps where `streamed`), then each job's own attention, scores and allocation."""
    clock = time.perf_counter()
    with torch.inference_mode():
        states = batched_prefill(model, [job.context_ids for job in jobs], [job.queries_ids[0] for job in jobs], config,
                                 layers, keep_streams=streamed)
    prefill_ms = _lap(clock)
    for k, (job, plan, state) in enumerate(zip(jobs, plans, states)):
        clock = time.perf_counter()
        query = QueryPass(model, state, job.context_ids, job.queries_ids[0], job.budget, config,
                          stream=state.context_stream)
        with torch.inference_mode():
            attention, coarse = plan.attention(query)
        inputs = ScoreInputs(length=job.context_ids.numel(), attention=attention, state=state, sink=config.sink,
                             budget=job.budget, coarse_attention=coarse)
        selection = score_and_allocate(inputs, plan.scorer, {"prefill": round(prefill_ms + _lap(clock), 3)}, job.units)
        selection.prefill_shared, selection.measured = len(jobs), query.measured
        finished(k, selection)


def joins_a_batch(length: int, budget: int, plan: Reading, config: PrefillConfig) -> bool:
    """Whether a one-query request of `length` context tokens goes through the batched prefill (when batching
    is on): its reading plan takes it, its context is one prefill chunk and longer than the budget."""
    return plan.batchable and budget < length and fits_one_chunk(length, config)


def score_and_allocate(inputs: ScoreInputs, strategy: Strategy, timings: dict[str, float], units: Units | None = None,
                       memo: dict[str, torch.Tensor] | None = None) -> Selection:
    """Score (`inputs`: the query's A^C (L,) from the reading plan, None for a query-agnostic strategy; a cascade's
    A^C at its coarse layer) and allocate: the sink + budget - S tokens, or with `units`, as many tokens in whole
    units around the strategy's own choice. `timings` gains "score" and "allocate"; `memo`: where a query-agnostic
    strategy's scores for this context are kept between queries."""
    clock = time.perf_counter()
    with torch.inference_mode():
        scores = memo.get(strategy.memo_key) if memo is not None else None
        if scores is None:
            scores = strategy.score(inputs)
            if memo is not None:
                memo[strategy.memo_key] = scores
        timings["score"] = _lap(clock)
        clock = time.perf_counter()
        kept = strategy.select(scores, inputs.budget, inputs.sink)
        if units is not None:
            kept = select_units(scores, units.bounds, kept, inputs.sink, units.heads)
        kept = kept.cpu()
        timings["allocate"] = _lap(clock)
    return Selection(kept, timings, scores=scores)


def _lap(start: float) -> float:
    return round((time.perf_counter() - start) * 1000.0, 3)
