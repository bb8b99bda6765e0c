"""ReAttention (section 3): the vectorised strategy against the literal loop of tests/reference.py
(odd lengths, many budgets, ties, k', GQA), position-agnostic scores, and through the pipeline."""

from __future__ import annotations

import pytest
import torch

from ilre.compressor.context_state import RetrievalState
from tests.selecting import select_context
from ilre.compressor.prefill import encode_context, prefill_query
from ilre.compressor.prefill_config import PrefillConfig
from ilre.compressor.strategies import ScoreInputs, make_strategy
from ilre.kernels.rope import apply_rope
from ilre.models.loader import load_truncated
from tests.reference import literal_reattention
from tests.tiny_models import N_LAYERS, random_ids, tiny_checkpoint


def run(raw_q, raw_k, budget, sink, **options):
    strategy = make_strategy("reattention", options)
    state = RetrievalState(keys={}, queries={}, parts={"raw_queries": raw_q, "raw_keys": raw_k})
    scores = strategy.score(ScoreInputs(length=raw_k.shape[1], state=state, sink=sink, budget=budget))
    return strategy.select(scores, budget, sink).tolist(), strategy


@pytest.mark.parametrize("length", [37, 64, 101, 250])
@pytest.mark.parametrize("options", [{}, {"span": 5, "k": 2}, {"span": 3, "k": 3, "k_prime": 4},
                                     {"global_tokens": 7, "local_tokens": 9, "span": 6}])
def test_equals_the_literal_algorithm(length, options):
    gen = torch.Generator().manual_seed(length)
    raw_q, raw_k = torch.randn(4, 3, 8, generator=gen), torch.randn(2, length, 8, generator=gen)  # GQA: 2 groups
    for budget in sorted({1, 4, 9, length // 4, length // 2, length - 3, length - 1}):
        got, strategy = run(raw_q, raw_k, budget, 4, **options)
        glob, local = strategy.regions(length, budget, 4)
        want = literal_reattention(raw_q, raw_k, budget, glob, local, strategy.span, strategy.k, strategy.k_prime)
        assert got == want, (budget, options)
        assert len(got) == budget and got == sorted(set(got))


def test_ties_go_to_the_lower_index():
    raw_q = torch.ones(2, 2, 4)
    raw_k = torch.randint(0, 2, (1, 80, 4), generator=torch.Generator().manual_seed(1)).float()
    for budget in (10, 30, 55):
        got, s = run(raw_q, raw_k, budget, 4, span=3, k=5)
        glob, local = s.regions(80, budget, 4)
        assert got == literal_reattention(raw_q, raw_k, budget, glob, local, 3, 5)


def test_defaults_scale_with_the_budget():
    strategy = make_strategy("reattention")
    assert strategy.regions(100_000, 1024, 4) == (4, 512)
    assert strategy.regions(100_000, 8192, 4) == (32, 4096)  # the paper's scope
    with pytest.raises(ValueError, match="span: must be an integer >= 1"):
        make_strategy("reattention", {"span": 0})


def test_scores_do_not_depend_on_positions():
    """Moving every key (and the query) to other positions changes post-RoPE dot products, not the
    pre-RoPE votes ReAttention ranks by."""
    model = load_truncated(tiny_checkpoint("llama"), N_LAYERS)
    layer = model.layer(N_LAYERS)
    h = torch.randn(40, model.spec.hidden_size, generator=torch.Generator().manual_seed(0))
    near, far = model.rope(torch.arange(40)), model.rope(torch.arange(40) * 7 + 1000)
    raw = [layer.parts(h, *where, ("raw_keys", "raw_queries", "keys", "queries")) for where in (near, far)]
    assert torch.equal(raw[0]["raw_keys"], raw[1]["raw_keys"]) and torch.equal(raw[0]["raw_queries"], raw[1]["raw_queries"])
    assert not torch.allclose(raw[0]["keys"], raw[1]["keys"])  # the rotated keys moved
    votes = [run(r["raw_queries"][:, -3:], r["raw_keys"][:, :37], 12, 2)[0] for r in raw]
    assert votes[0] == votes[1]
    q_rot, k_rot = raw[1]["queries"], apply_rope(raw[1]["raw_keys"], *far)
    assert torch.allclose(k_rot, raw[1]["keys"])


def test_through_the_pipeline_equals_the_reference_on_prefill_parts():
    model = load_truncated(tiny_checkpoint("qwen3"), N_LAYERS)
    config = PrefillConfig(sink=2, window=5, chunk=7, dca=True)
    context, query = random_ids(80, seed=4), random_ids(5, seed=5)
    strategy = make_strategy("reattention", {"span": 4})
    got = select_context(model, context, query, 24, strategy, config).kept.tolist()
    state = encode_context(model, context, config, parts=strategy.context_parts)
    parts = prefill_query(model, state, query, strategy.query_parts).parts
    glob, local = strategy.regions(80, 24, 2)
    assert got == literal_reattention(parts["raw_queries"], parts["raw_keys"], 24, glob, local, 4, 4)
