"""Locret (section 4): the retaining head and the chunked eviction against the literal loops of
tests/reference.py, and the strategy through the pipeline without a query (its training:
tests/training/test_train_locret.py)."""

from __future__ import annotations

import math

import pytest
import torch

from ilre.compressor.context_state import HEAD_INPUTS, RetrievalState
from tests.selecting import select_context, select_query
from ilre.compressor.prefill import encode_context
from ilre.compressor.prefill_config import PrefillConfig
from ilre.compressor.strategies import ScoreInputs, make_strategy
from ilre.models.loader import load_spec, load_truncated
from ilre.models.retaining_head import RetainingHead, attach_head, head_path
from tests.reference import literal_locret, literal_retaining_scores
from tests.tiny_models import N_LAYERS, random_ids, tiny_checkpoint


def run(scores: torch.Tensor, budget: int, sink: int, **options) -> list[int]:
    strategy = make_strategy("locret", options)
    state = RetrievalState(keys={}, queries={}, parts={"retaining": scores.reshape(1, -1, 1)})
    ranked = strategy.score(ScoreInputs(length=scores.numel(), state=state, sink=sink, budget=budget))
    return strategy.select(ranked, budget, sink).tolist()


@pytest.mark.parametrize("length,chunk,stabilisers,local,sink", [
    (61, 8, 3, 2, 4), (97, 13, 0, 5, 0), (40, 40, 6, 1, 2), (23, 5, 9, 0, 4), (130, 16, 16, 7, 4), (77, 1, 2, 3, 1)])
def test_eviction_equals_the_literal_algorithm(length, chunk, stabilisers, local, sink):
    gen = torch.Generator().manual_seed(length * chunk + stabilisers)
    scores = torch.randn(length, generator=gen)
    for budget in sorted({1, 2, sink + 1, local + sink + 1, length // 3, length // 2, length - 1}):
        if not 0 < budget < length:
            continue
        got = run(scores, budget, sink, chunk=chunk, stabilisers=stabilisers, local=local)
        want = literal_locret(scores.tolist(), budget, sink, local, stabilisers, chunk)
        assert got == want, (budget, got, want)
        assert len(got) == budget and got == sorted(set(got))


def test_ties_go_to_the_lower_index_and_the_defaults_scale_with_the_budget():
    scores = torch.randint(0, 3, (300,), generator=torch.Generator().manual_seed(5)).float()  # many equal scores
    for budget in (20, 64, 150):
        stabilisers, local, chunk = make_strategy("locret").sizes(budget)
        assert run(scores, budget, 4) == literal_locret(scores.tolist(), budget, 4, local, stabilisers, chunk)
    assert make_strategy("locret").sizes(1024) == (156, 6, 64)  # Table 9's Llama row x 1024 / 16384


def test_stabilisers_keep_recent_tokens_that_a_global_top_k_drops():
    scores = torch.arange(40, 0, -1).float()  # older = better: a global top-k keeps the start
    no_stab = run(scores, 10, 0, chunk=10, stabilisers=0, local=0)
    assert no_stab == list(range(10))
    with_stab = run(scores, 10, 0, chunk=10, stabilisers=4, local=0)
    assert with_stab != no_stab and len(with_stab) == 10  # protected units pushed older ones out for good


def test_head_scores_equal_the_literal_mlp():
    gen = torch.Generator().manual_seed(2)
    raw_q, raw_k, values = torch.randn(4, 7, 3, generator=gen), torch.randn(2, 7, 3, generator=gen), torch.randn(2, 7, 3, generator=gen)
    head = RetainingHead(4 * 3 + 2 * 2 * 3, 5, 2)
    with torch.no_grad():
        head.w1.normal_(generator=gen)
        head.w2.normal_(generator=gen)
    got = head.score(raw_q, raw_k, values)[..., 0]
    want = torch.tensor(literal_retaining_scores(raw_q, raw_k, values, head.w1.detach(), head.w2.detach()))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_runs_without_a_query_once_per_context_and_a_missing_head_names_the_command(tmp_path, monkeypatch):
    checkpoint = tiny_checkpoint("llama")
    model = load_truncated(checkpoint, N_LAYERS)
    config = PrefillConfig(sink=2, window=5, chunk=7)
    context = random_ids(90, seed=9)
    strategy = make_strategy("locret", {"chunk": 16, "stabilisers": 4, "local": 3})
    with pytest.raises(ValueError, match="train-locret --layer 4"):
        encode_context(model, context, config, parts=strategy.context_parts)
    head = RetainingHead.for_spec(load_spec(checkpoint), 8, seed=1)
    head.save(head_path("tiny-model", N_LAYERS, tmp_path))
    monkeypatch.setenv("ILRE_LOCRET_DIR", str(tmp_path))
    attach_head(model, "Tiny-Model")
    alone = select_context(model, context, torch.empty(0, dtype=torch.int64), 30, strategy, config)
    state = encode_context(model, context, config, parts=strategy.context_parts)
    first = select_query(model, state, random_ids(5, seed=1), 30, strategy, context)
    assert first.kept.tolist() == alone.kept.tolist() and len(alone.kept) == 30
    memo = dict(state.scores)
    assert select_query(model, state, random_ids(3, seed=2), 30, strategy, context).kept.tolist() == first.kept.tolist()
    assert all(state.scores[k] is memo[k] for k in memo)  # scored once per context
    raw = encode_context(model, context, config, parts=HEAD_INPUTS)
    want = torch.tensor(literal_retaining_scores(*(raw.parts[p] for p in HEAD_INPUTS), head.w1, head.w2))
    torch.testing.assert_close(state.parts["retaining"][..., 0], want, rtol=1e-4, atol=1e-4)
    scores = want.amax(dim=0).tolist()
    assert first.kept.tolist() == literal_locret(scores, 30, 2, 3, 4, 16)
    assert not math.isnan(sum(scores))
