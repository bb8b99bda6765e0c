"""LagKV (section 2.2): the vectorised strategy against the literal loop of tests/reference.py on
random K/V (odd lengths, many budgets, ties, both head rules), and through the pipeline without a
query."""

from __future__ import annotations

import pytest
import torch

from ilre.compressor.context_state import RetrievalState
from tests.selecting import select_context, select_query
from ilre.compressor.prefill import encode_context
from ilre.compressor.prefill_config import PrefillConfig
from ilre.compressor.strategies import ScoreInputs, make_strategy
from ilre.kernels.rope import keys_as_read
from ilre.models.loader import load_truncated
from tests.reference import literal_lagkv
from tests.tiny_models import N_LAYERS, random_ids, tiny_checkpoint


def run(keys, values, budget, pipeline_sink, **options):
    strategy = make_strategy("lagkv", options)
    state = RetrievalState(keys={3: keys}, queries={}, parts={"values": values})
    scores = strategy.score(ScoreInputs(length=keys.shape[1], state=state, sink=pipeline_sink, budget=budget))
    return strategy.select(scores, budget, pipeline_sink).tolist()


@pytest.mark.parametrize("length,lag,sink", [(61, 8, 5), (97, 7, 4), (40, 6, 3), (23, 8, 4), (130, 16, 16)])
@pytest.mark.parametrize("heads", ["sum", "max"])
def test_equals_the_literal_algorithm(length, lag, sink, heads):
    gen = torch.Generator().manual_seed(length * lag)
    keys, values = torch.randn(2, length, 6, generator=gen), torch.randn(2, length, 6, generator=gen)
    for budget in sorted({1, 3, sink, sink + 1, length // 3, length // 2, length - lag, length - 1}):
        if not 0 < budget < length:
            continue
        got = run(keys, values, budget, pipeline_sink=4, sink=sink, lag=lag, heads=heads)
        want = literal_lagkv(keys, values, budget, max(sink, 4), lag, heads)
        assert got == want, (budget, got, want)
        assert len(got) == budget and got == sorted(set(got))


def test_ties_go_to_the_lower_index():
    gen = torch.Generator().manual_seed(3)
    keys = torch.randint(0, 2, (1, 70, 4), generator=gen).float()  # few distinct rows: many equal scores
    values = torch.randint(0, 2, (1, 70, 4), generator=gen).float()
    for budget in (20, 33, 41):
        assert run(keys, values, budget, 4, sink=4, lag=10) == literal_lagkv(keys, values, budget, 4, 10)


def test_each_partition_keeps_its_share_not_a_global_top_k():
    keys, values = torch.randn(1, 4 + 5 * 10, 8), torch.randn(1, 4 + 5 * 10, 8)
    kept = run(keys, values, 4 + 10 + 4 * 3, 4, sink=4, lag=10)  # sink, window (last partition), 3 per partition
    for p in range(4):
        assert sum(4 + p * 10 <= i < 14 + p * 10 for i in kept) == 3
    assert kept[-10:] == list(range(44, 54))


def test_bad_options_name_the_field():
    with pytest.raises(ValueError, match="lag: must be an integer >= 1"):
        make_strategy("lagkv", {"lag": 0})
    with pytest.raises(ValueError, match="heads: must be sum or max"):
        make_strategy("lagkv", {"heads": "mean"})


def test_runs_without_a_query_and_scores_once_per_context():
    model = load_truncated(tiny_checkpoint("llama"), N_LAYERS)
    config = PrefillConfig(sink=2, window=5, chunk=7)
    context = random_ids(90, seed=9)
    strategy = make_strategy("lagkv", {"sink": 4, "lag": 8})
    no_query = torch.empty(0, dtype=torch.int64)
    alone = select_context(model, context, no_query, 30, strategy, config)
    state = encode_context(model, context, config, parts=strategy.context_parts)
    first = select_query(model, state, random_ids(5, seed=1), 30, strategy, context)
    assert first.kept.tolist() == alone.kept.tolist() and len(alone.kept) == 30
    memo = dict(state.scores)
    second = select_query(model, state, random_ids(3, seed=2), 30, strategy, context)
    assert second.kept.tolist() == first.kept.tolist() and state.scores.keys() == memo.keys()
    assert all(state.scores[k] is memo[k] for k in memo)  # not recomputed
    keys, values = keys_as_read(state.keys[N_LAYERS]), state.parts["values"]
    assert first.kept.tolist() == literal_lagkv(keys.float(), values.float(), 30, 4, 8)
