"""A context that grows (a conversation one turn longer, a tool result appended) takes the prefill of its cached
prefix on: compressing C + D after C selects exactly what compressing C + D on a fresh engine selects, and the
result says how many tokens were taken on. Only the caller's own scope is searched."""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from ilre.compressor.context_state import chunk_bounds
from tests.selecting import select_query
from ilre.compressor.prefill import encode_context, extend_context
from ilre.compressor.prefill_config import PrefillConfig
from ilre.contract.messages import CompressRequest
from ilre.engine.documents import DocumentCache
from ilre.evaluation.tasks.haystack import shakespeare_text
from ilre.service.documents.redis_tier import RedisDocuments
from tests.service.conftest import comparable
from tests.reference import full_depth_options

from .test_documents import CANDIDATES
from tests.shallow import engine_on_shallow_calibration  # noqa: F401 (engine: a flow, on the shallow calibration)


QUERY = " Question: who speaks of the crown? Answer:"
CHUNK = PrefillConfig().chunk
C_MID, C_EDGE = 1500, 1028  # C ends inside its second chunk; C ends on the boundary of its first (1024 + 4)
STRATEGIES = ["ilre", "snapkv", "streaming_llm", "lagkv", "reattention", "actqkv", "locret"]


@lru_cache(maxsize=None)
def ids(engine) -> list[int]:
    return engine.tokenizer(shakespeare_text()[:30000]).input_ids


@pytest.fixture()
def cache(engine):
    kept = engine.documents
    engine.documents = DocumentCache(1 << 30)
    yield engine.documents
    engine.documents = kept


def grown(engine, prefix: int, added: int, strategies: list[dict]) -> list[tuple[dict, dict]]:
    """For each request option set: (C + D's answer after C's, C + D's answer on a fresh cache); C's and C + D's
    requests of every option set go to the engine's cache in that order, the fresh ones to one other cache."""
    context = ids(engine)[: prefix + added]
    asks = [dict(query=QUERY, budget=256, **options) for options in strategies]
    for ask in asks:
        assert engine.compress(CompressRequest(context_ids=context[:prefix], **ask)).resumed_tokens == 0
    later = [engine.compress(CompressRequest(context_ids=context, **ask)).to_dict() for ask in asks]
    kept = engine.documents
    try:
        engine.documents = DocumentCache(1 << 30)
        fresh = [engine.compress(CompressRequest(context_ids=context, **ask)).to_dict() for ask in asks]
    finally:
        engine.documents = kept
    return list(zip(later, fresh))


def resume_at(prefix: int) -> int:
    bounds = chunk_bounds(prefix, PrefillConfig())
    return prefix if bounds[-1][1] - bounds[-1][0] == CHUNK + (4 if len(bounds) == 1 else 0) else bounds[-1][0]


@pytest.mark.parametrize("prefix, added, dca", [(C_MID, 300, "on"), (C_EDGE, CHUNK, "on"),
                                                (C_MID, CHUNK + 17, "on"), (C_MID, CHUNK + 17, "off")])
def test_a_grown_context_selects_what_a_fresh_engine_selects(engine, cache, prefix, added, dca):
    """The default (the cascade), D shorter than a chunk, exactly one and more, C ending inside a chunk and on
    a boundary, DCA on and off."""
    [(later, fresh)] = grown(engine, prefix, added, [dict(dca=dca)])
    assert later["resumed_tokens"] == resume_at(prefix) > 0 and fresh["resumed_tokens"] == 0
    assert comparable(later) == comparable(fresh)
    assert cache.stats.hits["prefix", "local"] == 1


def test_every_strategy_selects_the_same_from_a_grown_context(engine, cache):
    """The strategies reading one encoding share it: the first to ask for C + D takes C's on, the rest read that."""
    answers = grown(engine, C_MID, 700, [dict(strategy=name, dca="on") for name in STRATEGIES])
    for name, (later, fresh) in zip(STRATEGIES, answers):
        assert comparable(later) == comparable(fresh), name
    resumed = {name: later["resumed_tokens"] for name, (later, _) in zip(STRATEGIES, answers)}
    assert resumed["ilre"] == resumed["lagkv"] == resumed["locret"] == resume_at(C_MID), resumed  # own encodings
    assert resumed["streaming_llm"] == 0  # reads no attention: nothing is encoded


def test_whole_units_from_a_grown_context(engine, cache):
    answers = grown(engine, C_MID, 700, [dict(strategy=name, granularity="unit") for name in ("cascade", "ilre")])
    for later, fresh in answers:
        assert later["granularity"] == "unit" and comparable(later) == comparable(fresh)
    assert answers[0][0]["resumed_tokens"] == resume_at(C_MID)


def test_another_scope_never_takes_a_prefix_on(engine, cache):
    context = ids(engine)[: C_MID + 300]
    engine.compress(CompressRequest(context_ids=context[:C_MID], query=QUERY, budget=256), "key:a")
    other = engine.run(CompressRequest(context_ids=context, query=QUERY, budget=256), "key:b").results[0]
    assert other.resumed_tokens == 0 and cache.stats.hits["prefix", "local"] == 0
    own = engine.run(CompressRequest(context_ids=context, query=QUERY, budget=256), "key:a").results[0]
    assert own.resumed_tokens == resume_at(C_MID) and comparable(own) == comparable(other)


def test_a_worker_takes_on_a_prefix_another_worker_encoded_through_the_shared_tier(engine, redis_server):
    """Worker A's cache encodes C; worker B's (nothing local, the same Redis) answers C + D by taking C's on."""
    store = RedisDocuments(redis_server.url, prefix="docs-grow", max_bytes=1 << 30, ttl_s=60)
    context = ids(engine)[: C_MID + 700]
    ask = dict(query=QUERY, budget=256, dca="on")
    kept = engine.documents
    try:
        engine.documents = DocumentCache(1 << 30, store)
        engine.compress(CompressRequest(context_ids=context[:C_MID], **ask))
        engine.documents = worker_b = DocumentCache(1 << 30, store)
        later = engine.compress(CompressRequest(context_ids=context, **ask))
        engine.documents = DocumentCache(1 << 30)
        fresh = engine.compress(CompressRequest(context_ids=context, **ask))
    finally:
        engine.documents = kept
        store.close()
    assert later.resumed_tokens == resume_at(C_MID) and comparable(later) == comparable(fresh)
    assert worker_b.stats.hits["prefix", "shared"] == 1 and worker_b.stats.misses["prefix", "local"] == 1


def test_a_chat_one_turn_longer_takes_its_deepened_prefix_on(engine):
    """With deepening on, C is deepened once asked; C + D then takes C's deep encoding on (its coarse one was
    dropped) and is answered by the deepened path: what a fresh full-depth read of C + D answers."""
    from tests.engine.test_deepening import deepening_on, uncached

    context = ids(engine)[: C_MID + 700]
    ask = dict(query=QUERY, budget=256, strategy_options=CANDIDATES)
    blended = full_depth_options(engine.profile)
    reference = uncached(engine, CompressRequest(context_ids=context, query=QUERY, budget=256, strategy="ilre",
                                                 strategy_options=blended))
    with deepening_on(engine):
        engine.compress(CompressRequest(context_ids=context[:C_MID], **ask))
        assert engine.deepening.wait_idle(120) and engine.deepening.stats.finished == 1
        later = engine.compress(CompressRequest(context_ids=context, **ask))
        cache = engine.documents
    assert later.resumed_tokens == resume_at(C_MID) and cache.stats.hits["prefix", "local"] >= 1
    drop = ("strategy", "fell_back")
    assert {k: v for k, v in comparable(later).items() if k not in drop} == {k: v for k, v in reference.items()
                                                                              if k not in drop}


def test_a_step_sent_before_the_deepening_ends_takes_the_prefix_on_with_its_stream(engine):
    """An agent's next step at once: C's coarse encoding, its stream and the rows of the candidates C's question
    ran taken on (the new chunks only), the candidates started from the stream: what the pipeline selects on C's
    encoding with its stream, asked C's question, then taken on to the longer context."""
    from tests.engine.test_deepening import deepening_on

    context = ids(engine)[: C_MID + 700]
    ask = dict(query=QUERY, budget=256, strategy_options=CANDIDATES)
    with deepening_on(engine), engine.deepening.paused():
        engine.compress(CompressRequest(context_ids=context[:C_MID], **ask))
        later = engine.compress(CompressRequest(context_ids=context, **ask))
        assert engine.deepening.stats.steps == 0
    assert later.resumed_tokens == resume_at(C_MID) and not later.fell_back
    assert later.kept_indices == kept_taken_on(engine, CompressRequest(context_ids=context[:C_MID], **ask),
                                               CompressRequest(context_ids=context, **ask))


def test_holding_streams_without_deepening_takes_the_prefix_on_with_its_stream(engine, cache):
    """`--deepen hold` (a batch job's default): no document is deepened, yet C's encoding holds its stream and a
    grown C + D sent right after starts its candidates there, as a step before the deepening ends does; with it
    off (the engine's default here) C + D selects what a fresh engine selects (the tests above)."""
    context = ids(engine)[: C_MID + 700]
    ask = dict(query=QUERY, budget=256, strategy_options=CANDIDATES)
    engine.encodings.hold_streams, steps = True, engine.deepening.stats.steps
    try:
        engine.compress(CompressRequest(context_ids=context[:C_MID], **ask))
        (held,) = [state for entry in cache._docs.values() for state in entry.states.values()]
        assert held.hidden is not None and held.hidden.shape[0] == C_MID  # counted in the cache's bound
        later = engine.compress(CompressRequest(context_ids=context, **ask))
    finally:
        engine.encodings.hold_streams = False
    assert not engine.deepening.enabled and engine.deepening.stats.steps == steps
    assert later.resumed_tokens == resume_at(C_MID) and not later.fell_back
    assert later.kept_indices == kept_taken_on(engine, CompressRequest(context_ids=context[:C_MID], **ask),
                                               CompressRequest(context_ids=context, **ask))


def kept_taken_on(engine, first: CompressRequest, later: CompressRequest) -> list[int]:
    """What the pipeline keeps for `later` on the encoding of `first`'s context (with its stream), asked `first`'s
    question (its candidates from the stream, as a first question's), then taken on to `later`'s context
    (prefill.extend_context), its candidates from the stream."""
    asked, job = engine.prepare(first), engine.prepare(later)
    with torch.inference_mode():
        state = encode_context(asked.model, asked.context_ids, asked.prefill,
                               asked.strategy.reading().encoded_layers(asked.layer), keep_hidden=True)
        select_query(asked.model, state, asked.queries[0], asked.budget, asked.strategy,
                     context_ids=asked.context_ids, units=asked.units, stream=state.hidden)
        longer = extend_context(job.model, state, job.context_ids, keep_hidden=True)
    assert longer.rows is not None and longer.rows.rows is state.rows.rows
    return select_query(job.model, longer, job.queries[0], job.budget, job.strategy, context_ids=job.context_ids,
                        units=job.units, stream=longer.hidden).kept.tolist()


def test_with_resuming_off_nothing_is_taken_on_and_no_resume_point_is_kept(engine):
    context = ids(engine)[: C_MID + 300]
    kept = engine.documents
    try:
        engine.documents = DocumentCache(1 << 30)
        engine.encodings.resume = False
        engine.compress(CompressRequest(context_ids=context[:C_MID], query=QUERY, budget=256))
        later = engine.compress(CompressRequest(context_ids=context, query=QUERY, budget=256))
        held = [state for entry in engine.documents._docs.values() for state in entry.states.values()]
    finally:
        engine.encodings.resume = True
        engine.documents = kept
    assert later.resumed_tokens == 0 and held and all(state.resume is None for state in held)
