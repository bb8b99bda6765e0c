"""The pipeline's entry points (compressor/pipeline.py): `select` runs one request (its context encoded once, then
its questions), `select_batch` many one-question requests (the short ones through one batched prefill), each equal to
running them one by one; a context that fits its budget is passed through with nothing run."""

from __future__ import annotations

from functools import lru_cache

import pytest

from ilre.compressor import pipeline
from ilre.compressor.pipeline import SelectionJob, select, select_batch
from ilre.compressor.prefill_config import PrefillConfig
from ilre.compressor.strategies import make_strategy
from ilre.models.loader import load_truncated
from tests.selecting import select_context
from tests.tiny_models import N_LAYERS, random_ids, single_thread, tiny_checkpoint  # noqa: F401

CONFIG = PrefillConfig(sink=2, window=5, chunk=12)


@lru_cache(maxsize=None)
def model(kind: str):
    return load_truncated(tiny_checkpoint(kind), N_LAYERS)


def test_a_context_within_the_budget_is_passed_through_with_nothing_run(monkeypatch):
    monkeypatch.setattr(pipeline, "encode_context", lambda *a, **k: pytest.fail("encoded a context that fits"))
    context = random_ids(12, seed=1)
    got = select(model("llama"), SelectionJob(context, [random_ids(3, seed=2), random_ids(4, seed=3)], 12,
                                              make_strategy("cascade", {"coarse_layer": 2})), CONFIG)
    assert [(s.passthrough, s.kept.tolist()) for s in got] == [(True, list(range(12)))] * 2


@pytest.mark.parametrize("name", ["ilre", "snapkv", "lagkv"])
def test_one_request_of_several_questions_encodes_its_context_once(monkeypatch, name):
    """Each question's selection equals its own request's; the context is encoded once for all of them (a
    query-agnostic strategy's scores computed once too)."""
    context, asked = random_ids(40, seed=4), [random_ids(n, seed=5 + n) for n in (3, 5, 2)]
    strategy = make_strategy(name)
    alone = [select_context(model("llama"), context, q, 10, strategy, CONFIG).kept.tolist() for q in asked]
    made, real = [], pipeline.encode_context
    monkeypatch.setattr(pipeline, "encode_context", lambda *a, **k: made.append(1) or real(*a, **k))
    scored, score = [], type(strategy).score
    monkeypatch.setattr(type(strategy), "score", lambda self, inputs: scored.append(1) or score(self, inputs))
    together = select(model("llama"), SelectionJob(context, asked, 10, strategy), CONFIG)
    assert [s.kept.tolist() for s in together] == alone
    assert made == [1] and len(scored) == (1 if name == "lagkv" else len(asked))
    assert all(s.timings_ms["prefill"] > 0 and not s.passthrough for s in together)


def test_select_batch_equals_select_one_by_one_and_keeps_order():
    # a mix: short (batched), multi-chunk (streamed), passthrough, attention-free, in no order
    config = PrefillConfig(sink=2, window=5, chunk=12)
    specs = [(9, "ilre", 4), (40, "ilre", 10), (14, "snapkv", 6), (5, "ilre", 8), (13, "streaming_llm", 5),
             (11, "ilre", 3), (3, "ilre", 1), (30, "snapkv", 7)]
    jobs = [SelectionJob(random_ids(n, seed=i), [random_ids(3, seed=100 + i)], budget, make_strategy(name))
            for i, (n, name, budget) in enumerate(specs)]
    together = select_batch(model("qwen2"), jobs, config, batch_tokens=30)  # forces several groups
    for job, got in zip(jobs, together):
        alone = select_context(model("qwen2"), job.context_ids, job.queries_ids[0], job.budget, job.strategy, config)
        assert got.kept.tolist() == alone.kept.tolist()
        assert got.passthrough == alone.passthrough
        assert got.kept.device.type == "cpu"


def test_the_default_and_blended_layers_take_the_batched_prefill():
    """The cascade with its candidate stage (the coarse layer batched, the candidates of each run after it from the
    stream the batch kept) and on a context its candidates cover (l_R with the coarse layer blended), and ILRe with
    also_layers: batched with the requests that encode the same layers, each selection equals its own streaming one."""
    config = PrefillConfig(sink=2, window=5, chunk=24)
    strategies = [make_strategy("cascade", {"coarse_layer": 1}), make_strategy("ilre", {"also_layers": [2]}),
                  make_strategy("ilre"), make_strategy("cascade", {"coarse_layer": 2, "coarse_weight": 1.0}),
                  make_strategy("cascade", {"coarse_layer": 1, "candidates": 2}),
                  make_strategy("cascade", {"coarse_layer": 2, "candidates": 1.5, "coarse_weight": 0.0})]
    jobs = [SelectionJob(random_ids(20 + i, seed=200 + i), [random_ids(3, seed=300 + i)], 6, strategy)
            for i, strategy in enumerate(strategies)]
    resolved = [job.strategy.reading().for_context(job.context_ids.numel(), job.budget) for job in jobs]
    assert all(plan.batchable for plan in resolved)
    assert [plan.encoded_layers(N_LAYERS) for plan in resolved][-2:] == [(1,), (2,)]  # these two run their candidates
    together = select_batch(model("llama"), jobs, config, batch_tokens=200)
    for job, got in zip(jobs, together):
        alone = select_context(model("llama"), job.context_ids, job.queries_ids[0], job.budget, job.strategy, config)
        assert got.kept.tolist() == alone.kept.tolist()
        assert got.measured == alone.measured  # the candidates' pass from the coarse stream, where they have one
    # layers 1 + l_R; 2 + l_R (twice: one prefill); l_R; 2 + l_R; 1 with candidates; 2 with candidates
    assert [got.prefill_shared for got in together] == [1, 2, 1, 2, 1, 1]
    assert together[-1].measured["from_layer"] == 2


def test_first_questions_of_a_batch_run_their_candidates_from_the_batch_streams():
    """Default cascades whose candidates do not cover their contexts: one batched prefill to the coarse layer, the
    streams entering it kept, each question's candidates run on from there as its own streaming selection runs them."""
    config = PrefillConfig(sink=2, window=5, chunk=24)
    strategy = make_strategy("cascade", {"coarse_layer": 2, "candidates": 1.5})
    jobs = [SelectionJob(random_ids(18 + 2 * i, seed=400 + i), [random_ids(2 + i, seed=500 + i)], 6, strategy)
            for i in range(4)]
    together = select_batch(model("llama"), jobs, config, batch_tokens=200)
    for job, got in zip(jobs, together):
        alone = select_context(model("llama"), job.context_ids, job.queries_ids[0], job.budget, job.strategy, config)
        assert got.kept.tolist() == alone.kept.tolist() and got.prefill_shared == len(jobs)
        assert got.measured["from_layer"] == alone.measured["from_layer"] == 2
