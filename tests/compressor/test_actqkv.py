"""ActQKV (section 4 as reconstructed): probe, cosine scores, chunk selection and the entropy budget
against the literal loops of tests/reference.py, and through the pipeline on a tiny model."""

from __future__ import annotations

import pytest
import torch

from ilre.compressor.context_state import RetrievalState
from tests.selecting import select_context
from ilre.compressor.prefill_config import PrefillConfig
from ilre.compressor.strategies import ScoreInputs, make_strategy
from ilre.compressor.strategies.actqkv import information_density, probe_query
from ilre.models.loader import load_truncated
from tests.reference import (literal_actqkv, literal_actqkv_scores, literal_entropy_budget, literal_probe)
from tests.tiny_models import N_LAYERS, random_ids, tiny_checkpoint


def qk(seed: int, length: int, n_query: int = 5, heads: int = 4, kv: int = 2, dim: int = 6):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(heads, n_query, dim, generator=gen), torch.randn(kv, length, dim, generator=gen)


def run(raw_q, raw_k, budget, sink, **options):
    strategy = make_strategy("actqkv", options)
    state = RetrievalState(keys={}, queries={}, parts={"raw_queries": raw_q, "raw_keys": raw_k})
    scores = strategy.score(ScoreInputs(length=raw_k.shape[1], state=state, sink=sink, budget=budget))
    return strategy, scores, strategy.select(scores, budget, sink).tolist()


@pytest.mark.parametrize("skip,weight", [(0, 0.0), (2, 0.0), (0, 4.0), (1, 1.5)])
def test_probe_and_scores_equal_the_literal_equations(skip, weight):
    raw_q, raw_k = qk(skip * 10 + int(weight), 37)
    torch.testing.assert_close(probe_query(raw_q, skip, weight), torch.tensor(literal_probe(raw_q, skip, weight)),
                               rtol=1e-4, atol=1e-5)
    _, scores, _ = run(raw_q, raw_k, 10, 2, skip=skip, question_weight=weight)
    torch.testing.assert_close(scores, torch.tensor(literal_actqkv_scores(raw_q, raw_k, skip, weight)),
                               rtol=1e-4, atol=1e-5)


def test_outlier_tokens_weigh_most_and_a_single_token_is_its_own_probe():
    raw_q = torch.ones(1, 6, 4)
    raw_q[0, 3] = torch.tensor([9.0, -9.0, 9.0, -9.0])  # the anchor: far from the window's mean
    probe = probe_query(raw_q)
    assert torch.cosine_similarity(probe, raw_q[0, 3:4], dim=-1) > 0.99
    one = torch.randn(2, 1, 4)
    torch.testing.assert_close(probe_query(one), one[:, 0])


@pytest.mark.parametrize("length,chunk,sink,local", [(61, 8, 3, 5), (97, 7, 0, 0), (40, 32, 4, 3), (130, 16, 16, 20)])
def test_chunk_selection_equals_the_literal_loop(length, chunk, sink, local):
    raw_q, raw_k = qk(length, length)
    for budget in sorted({sink + local + 1, length // 3, length // 2, length - 1}):
        if not sink + local < budget < length:
            continue
        _, scores, got = run(raw_q, raw_k, budget, 0, chunk=chunk, sink_tokens=sink, local_tokens=local)
        want = literal_actqkv(scores.tolist(), budget, sink, local, chunk)
        assert got == want, (budget, got, want)
        assert len(got) == budget and got == sorted(set(got))


def test_ties_go_to_the_earlier_chunk_and_token():
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    strategy = make_strategy("actqkv", {"chunk": 2, "sink_tokens": 0, "local_tokens": 0})
    got = strategy.select(scores, 5, 0).tolist()
    assert got == literal_actqkv(scores.tolist(), 5, 0, 0, 2) == [0, 1, 2, 3, 5]  # chunk [4, 5] by its best


def test_the_entropy_budget_equals_the_literal_one_and_grows_with_flatness():
    raw_q, raw_k = qk(3, 300)
    strategy, scores, kept = run(raw_q, raw_k, 100, 4, auto_budget=True, min_budget=20, temperature=0.05)
    sink, local = strategy.regions(300, 100, 4)
    chosen = literal_entropy_budget(scores[sink: 300 - local].tolist(), 100, 20, 0.05)
    assert strategy.chosen_budget(scores, 100, 4) == chosen and 20 <= chosen <= 100
    sink, local = strategy.regions(300, chosen, 4)
    assert kept == literal_actqkv(scores.tolist(), chosen, sink, local, 32)
    flat = torch.zeros(300)
    peaked = flat.clone()
    peaked[150] = 5.0
    assert strategy.chosen_budget(flat, 100, 4) == 100
    assert strategy.chosen_budget(peaked, 100, 4) < 60
    assert information_density(flat, 0.02) == pytest.approx(1.0)


def test_bad_options_name_the_field():
    for options, field in (({"chunk": 0}, "chunk"), ({"temperature": 0}, "temperature"),
                           ({"question_weight": -1}, "question_weight"), ({"auto_budget": "yes"}, "auto_budget"),
                           ({"min_budget": 0}, "min_budget")):
        with pytest.raises(ValueError, match=field):
            make_strategy("actqkv", options)


def test_through_the_pipeline_on_a_tiny_model():
    model = load_truncated(tiny_checkpoint("llama"), N_LAYERS)
    config = PrefillConfig(sink=2, window=5, chunk=7)
    context, query = random_ids(90, seed=4), random_ids(6, seed=5)
    fixed = select_context(model, context, query, 30, make_strategy("actqkv", {"chunk": 4}), config)
    assert len(fixed.kept) == 30 and fixed.kept.tolist() == sorted(set(fixed.kept.tolist()))
    auto = select_context(model, context, query, 30, make_strategy("actqkv", {"chunk": 4, "auto_budget": True}), config)
    assert 7 <= len(auto.kept) <= 30
