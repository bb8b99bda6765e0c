"""Batched prefill of short requests against the one-request streaming prefill."""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from ilre.compressor.batched_prefill import batched_prefill, fits_one_chunk
from ilre.compressor.pipeline import SelectionJob, select_context, select_contexts
from ilre.compressor.prefill import streaming_prefill
from ilre.compressor.prefill_config import PrefillConfig
from ilre.compressor.strategies import make_strategy
from tests.tiny_models import N_LAYERS, random_ids, single_thread, tiny_checkpoint  # noqa: F401
from ilre.kernels.rope import keys_as_read
from ilre.models.loader import load_truncated

CONFIGS = {
    "window_shorter_than_context": PrefillConfig(sink=2, window=5, chunk=24),
    "window_longer_than_context": PrefillConfig(sink=3, window=40, chunk=24),
    "unbounded": PrefillConfig(sink=2, window=None, chunk=24),
    "no_sink": PrefillConfig(sink=0, window=4, chunk=26),
}
# contexts of different lengths, shorter than the sink, exactly one chunk, and queries of different lengths
LENGTHS = [(1, 3), (2, 1), (7, 4), (15, 2), (26, 5), (20, 3)]


@lru_cache(maxsize=None)
def model(kind: str):
    return load_truncated(tiny_checkpoint(kind), N_LAYERS)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_batched_prefill_equals_one_by_one(kind, config_name):
    config = CONFIGS[config_name]
    contexts = [random_ids(n, seed=10 + i) for i, (n, _) in enumerate(LENGTHS)]
    queries = [random_ids(m, seed=50 + i) for i, (_, m) in enumerate(LENGTHS)]
    assert all(fits_one_chunk(c.numel(), config) for c in contexts)
    # lower layers' keys and queries too, as the default blends layer l_c's attention; a coarse layer alone, as
    # the default's candidate stage reads
    for layers in ((1, N_LAYERS - 1, N_LAYERS), (N_LAYERS - 1,)):
        batched = batched_prefill(model(kind), contexts, queries, config, layers)
        for context, query, got in zip(contexts, queries, batched):
            alone = streaming_prefill(model(kind), context, query, config, layers)
            assert set(got.keys) == set(got.queries) == set(layers)
            for layer in layers:
                torch.testing.assert_close(keys_as_read(got.keys[layer]), keys_as_read(alone.keys[layer]), atol=2e-5, rtol=1e-5)
                torch.testing.assert_close(got.queries[layer], alone.queries[layer], atol=2e-5, rtol=1e-5)


def test_batched_prefill_rejects_long_contexts_and_layers_not_below_l_r():
    config = PrefillConfig(sink=2, window=4, chunk=8)
    with pytest.raises(ValueError, match="chunk \\+ sink = 10"):
        batched_prefill(model("llama"), [random_ids(11, 0)], [random_ids(2, 1)], config)
    with pytest.raises(ValueError, match=f"layer: score layers must be within 1..{N_LAYERS}"):
        batched_prefill(model("llama"), [random_ids(5, 0)], [random_ids(2, 1)], config, (N_LAYERS + 1,))


def test_select_contexts_equals_select_context_and_keeps_order():
    # a mix: short (batched), multi-chunk (streamed), passthrough, attention-free, in no order
    config = PrefillConfig(sink=2, window=5, chunk=12)
    specs = [(9, "ilre", 4), (40, "ilre", 10), (14, "snapkv", 6), (5, "ilre", 8), (13, "streaming_llm", 5),
             (11, "ilre", 3), (3, "ilre", 1), (30, "snapkv", 7)]
    jobs = [SelectionJob(random_ids(n, seed=i), random_ids(3, seed=100 + i), budget, make_strategy(name))
            for i, (n, name, budget) in enumerate(specs)]
    together = select_contexts(model("qwen2"), jobs, config, batch_tokens=30)  # forces several groups
    for job, got in zip(jobs, together):
        alone = select_context(model("qwen2"), job.context_ids, job.query_ids, job.budget, job.strategy, config)
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
    jobs = [SelectionJob(random_ids(20 + i, seed=200 + i), random_ids(3, seed=300 + i), 6, strategy)
            for i, strategy in enumerate(strategies)]
    resolved = [job.strategy.reading().for_context(job.context_ids.numel(), job.budget) for job in jobs]
    assert all(plan.batchable for plan in resolved)
    assert [plan.encoded_layers(N_LAYERS) for plan in resolved][-2:] == [(1,), (2,)]  # these two run their candidates
    together = select_contexts(model("llama"), jobs, config, batch_tokens=200)
    for job, got in zip(jobs, together):
        alone = select_context(model("llama"), job.context_ids, job.query_ids, job.budget, job.strategy, config)
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
    jobs = [SelectionJob(random_ids(18 + 2 * i, seed=400 + i), random_ids(2 + i, seed=500 + i), 6, strategy)
            for i in range(4)]
    together = select_contexts(model("llama"), jobs, config, batch_tokens=200)
    for job, got in zip(jobs, together):
        alone = select_context(model("llama"), job.context_ids, job.query_ids, job.budget, job.strategy, config)
        assert got.kept.tolist() == alone.kept.tolist() and got.prefill_shared == len(jobs)
        assert got.measured["from_layer"] == alone.measured["from_layer"] == 2
