"""The engine (engine/engine.py), embedded model: a request prepared (the profile's options where they fit the layer
asked, else the strategy as asked), answered with what the pipeline selects for it, and Engine.compress_many (what
the queues run) against Engine.compress one by one."""

from __future__ import annotations

import pytest

from ilre.compressor.pipeline import SelectionJob, select
from ilre.compressor.strategies import make_strategy
from ilre.contract.messages import CompressRequest, InputError
from ilre.engine.documents import DocumentCache
from ilre.engine.engine import Engine, EngineConfig

from ..conftest import DTYPE, SHALLOW_COARSE, SHALLOW_LAYER, shallow_profile
from tests.service.conftest import QUERY, comparable, context
from tests.shallow import engine_on_shallow_calibration  # noqa: F401 (engine: a flow, on the shallow calibration)


@pytest.fixture(scope="module")
def batched() -> Engine:
    return Engine(EngineConfig(dtype=DTYPE, batch_tokens=4096),  # small groups: the 10 short requests need two
                  profile=shallow_profile())


def requests() -> list[CompressRequest]:
    """Short ones of different lengths and strategies (batched; the default among them, with and without
    its candidate pass), a bad one, one that fits its budget (passthrough), one longer than a prefill
    chunk (streamed alone)."""
    short = [CompressRequest(context=context(i, 1 + i % 4), query=QUERY, budget=24 + 8 * i,
                             strategy=("cascade", "cascade", "snapkv", "cascade", "streaming_llm", "ilre")[i % 6])
             for i in range(10)]  # the cascade runs its candidates at i = 1, 3, 7
    return short[:3] + [
        CompressRequest(context_ids=[1, 2, 10**9], query=QUERY),
        CompressRequest(context=context(0, 1), query=QUERY, budget=4096),
        CompressRequest(context=context(99, 14), query=QUERY, budget=64),
        CompressRequest(context=context(5), query=QUERY, budget=40, layer=SHALLOW_COARSE + 1),
    ] + short[3:]


def test_compress_many_equals_compress_one_by_one(batched, engine):
    reqs = requests()
    assert len(engine.tokenizer(reqs[5].context).input_ids) > 1028  # really two chunks
    order: list[int] = []
    outcomes = batched.compress_many(reqs, on_result=lambda i, outcome: order.append(i))
    assert sorted(order) == list(range(len(reqs)))  # each handed back once
    assert order[0] == 3  # the bad request is answered before any compute
    for request, outcome in zip(reqs, outcomes):
        if request.context_ids is not None:
            assert isinstance(outcome, InputError) and outcome.field == "context_ids"
            continue
        alone = batched.compress(request)
        assert comparable(outcome) == comparable(alone)
        assert comparable(outcome) == comparable(engine.compress(request))  # and batching off (the CPU default)
    assert outcomes[4].results[0].passthrough and outcomes[6].results[0].layer == SHALLOW_COARSE + 1


def test_batching_is_off_by_default_on_the_cpu(engine, batched):
    assert engine.placement.device.type == "cpu" and engine.batch_tokens == 0
    assert batched.batch_tokens == 4096


def test_the_profiles_options_apply_where_the_asked_layer_can_read_them(engine):
    """At the profile's l_R the cascade takes the profile's coarse layer; asked at that coarse layer (where a coarse
    layer cannot be below it) the strategy runs as asked, without the profile's options; a coarse layer the request
    itself sets at or above the layer is refused, naming the option."""
    requested = make_strategy("cascade")
    assert engine.fitting(requested, SHALLOW_LAYER).coarse_layer == SHALLOW_COARSE
    assert engine.fitting(requested, SHALLOW_COARSE) == requested
    result = engine.compress(CompressRequest(context=context(4, 3), query=QUERY, budget=32, layer=SHALLOW_COARSE))
    assert result.layer == SHALLOW_COARSE and len(result.kept_indices) == 32
    with pytest.raises(InputError) as err:
        engine.compress(CompressRequest(context=context(4, 3), query=QUERY, budget=32, layer=2,
                                        strategy_options={"coarse_layer": 2}))
    assert err.value.field == "strategy_options.coarse_layer" and "must be below l_R = 2" in str(err.value)


@pytest.mark.parametrize("fields", [{}, {"strategy": "snapkv"}, {"granularity": "unit"},
                                    {"queries": [QUERY, " Question: who is named first? Answer:"]}])
def test_an_answer_is_what_the_pipeline_selects_for_the_prepared_request(engine, fields):
    """With no document cache, each result's kept indices are the pipeline's selection (compressor/pipeline.select)
    for the request as prepared: its context and questions as token ids, budget, strategy and units."""
    request = CompressRequest(context=context(6, 3), budget=48, **({} if "queries" in fields else {"query": QUERY}),
                              **fields)
    kept = engine.documents
    engine.documents = DocumentCache(0)
    try:
        outcome = engine.run(request)
        job = engine.prepare(request)
    finally:
        engine.documents = kept
    selections = select(job.model, SelectionJob(job.context_ids, job.queries, job.budget, job.strategy, job.units),
                        job.prefill)
    assert [r.kept_indices for r in outcome.results] == [s.kept.tolist() for s in selections]
    assert all(len(r.kept_indices) <= 48 and r.token_ids[:3] == [job.context_ids[i].item() for i in r.kept_indices[:3]]
               for r in outcome.results)
