"""Engine.compress_many (what the queues run) against Engine.compress one by one, embedded model."""

from __future__ import annotations

import pytest

from ilre.contract.messages import CompressRequest, InputError
from ilre.engine.engine import Engine, EngineConfig

from ..conftest import DTYPE, SHALLOW_COARSE, shallow_profile
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
