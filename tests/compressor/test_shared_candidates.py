"""Several questions of one context share the cascade's candidate pass: the union of their candidates runs to
l_R once (candidate_prefill_many), each question after it exactly as in its own pass, and each is ranked as
the one-question cascade ranks a candidate set equal to the union; when the union would cost more than reading
the whole context on from the coarse layer, every question is answered as the deepened form answers it."""

from __future__ import annotations

import pytest
import torch

from ilre.compressor import pipeline
from ilre.compressor.candidate_prefill import candidate_prefill, candidate_prefill_many
from tests.selecting import select_context, select_context_queries, select_queries, select_query
from ilre.compressor.prefill import encode_context, prefill_query
from ilre.compressor import cascade_reading as cascade_module
from ilre.kernels.query_scores import query_key_scores
from tests.tiny_models import N_LAYERS, random_ids

from .test_cascade import CONFIGS, LENGTH, cascade, literal_candidates, model

QUERY_LENGTHS = (5, 3, 7)


def questions(seed: int) -> list[torch.Tensor]:
    return [random_ids(n, seed=seed + i) for i, n in enumerate(QUERY_LENGTHS)]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("candidates", [[0, 1, 2, 3, 5, 20, 21, 40, 41, 77, 88, 89], list(range(0, 90, 2)) + [1, 3]])
def test_each_query_of_a_shared_candidate_pass_equals_its_own_pass_bit_for_bit(config, candidates):
    context, asked = random_ids(LENGTH, seed=31), questions(32)
    chosen = torch.tensor(sorted(set(candidates)))
    with torch.inference_mode():
        keys, queries = candidate_prefill_many(model(), context, chosen, asked, config)
        for query_ids, shared in zip(asked, queries):
            own_keys, own = candidate_prefill(model(), context, chosen, query_ids, config)
            assert torch.equal(keys, own_keys) and torch.equal(shared, own)


def literal_union(strategy, context, asked, config, budget: int) -> list[int]:
    """Each question's candidates from the coarse layer (the literal loop of test_cascade), then their union."""
    state = encode_context(model(), context, config, strategy.reading().encoded_layers(N_LAYERS))
    count = strategy.reading().candidate_count(budget)
    union: set[int] = set()
    for query_ids in asked:
        retrieval = prefill_query(model(), state, query_ids)
        scores = query_key_scores(retrieval.queries[strategy.coarse_layer], retrieval.keys[strategy.coarse_layer])
        union |= set(literal_candidates(scores.tolist(), count, config.sink, min(config.window or count, count // 8)))
    return sorted(union)


@pytest.mark.parametrize("config", CONFIGS[:3])
@pytest.mark.parametrize("coarse, budget, factor, deep", [(1, 8, 2.0, False), (2, 16, 2.0, True)])
def test_questions_are_ranked_over_the_union_of_their_candidates_or_all_read_deep_once(config, coarse, budget, factor,
                                                                                      deep, monkeypatch):
    context, asked = random_ids(LENGTH, seed=41), questions(42)
    strategy = cascade(coarse_layer=coarse, candidates=factor)
    union = literal_union(strategy, context, asked, config, budget)
    assert strategy.reading().deep_pays(LENGTH, len(union), N_LAYERS) == deep  # the case is the branch it names
    with torch.inference_mode():
        got = select_context_queries(model(), context, asked, budget, strategy, config)
        if deep:  # every question as the deepened form answers it
            state = encode_context(model(), context, config, strategy.reading().deepened().reading().encoded_layers(N_LAYERS))
            expected = [select_query(model(), state, q, budget, strategy.reading().deepened(), context_ids=context) for q in asked]
        else:  # every question as the one-question cascade answers it with the union for its candidates
            monkeypatch.setattr(cascade_module, "pick_candidates", lambda *args: torch.tensor(union))
            expected = [select_context(model(), context, q, budget, strategy, config) for q in asked]
    assert [s.kept.tolist() for s in got] == [s.kept.tolist() for s in expected]
    for selection, reference in zip(got, expected):
        torch.testing.assert_close(selection.scores, reference.scores, rtol=0, atol=0)
        assert selection.measured.get("deep") == (1.0 if deep else None)
        assert selection.measured.get("candidates") == (None if deep else float(len(union)))
    assert len({tuple(s.kept.tolist()) for s in got}) > 1  # the questions still choose apart


def test_one_question_runs_its_own_candidates_and_the_deep_encoding_is_made_once(monkeypatch):
    config, context = CONFIGS[0], random_ids(LENGTH, seed=51)
    strategy = cascade(coarse_layer=2, candidates=2.0)
    with torch.inference_mode():
        alone = select_context_queries(model(), context, questions(52)[:1], 16, strategy, config)[0]
    assert "candidates" not in alone.measured and "deep" not in alone.measured
    made = []
    real = pipeline.encode_context
    monkeypatch.setattr(pipeline, "encode_context", lambda *a, **k: made.append(k.get("keep_hidden")) or real(*a, **k))
    resumes = []
    real_resume = pipeline.resume_context
    monkeypatch.setattr(pipeline, "resume_context", lambda *a, **k: resumes.append(1) or real_resume(*a, **k))
    with torch.inference_mode():
        got = select_context_queries(model(), context, questions(52), 16, strategy, config)
    assert all(s.measured.get("deep") for s in got)
    assert made == [True] and resumes == [1]  # the coarse encoding kept its resume point; the deep pass ran once


def test_a_coarse_below_question_reads_the_context_while_the_others_share_candidates():
    config, context = CONFIGS[0], random_ids(LENGTH, seed=61)
    asked = questions(62)
    plain = cascade(coarse_layer=1, candidates=1.0)
    with torch.inference_mode():
        state = encode_context(model(), context, config, plain.reading().encoded_layers(N_LAYERS))
        peaks = [select_query(model(), state, q, 8, plain, context_ids=context).measured["coarse_peak"] for q in asked]
        threshold = sorted(peaks)[1]  # below it: the weakest question only
        strategy = cascade(coarse_layer=1, candidates=1.0, coarse_below=threshold)
        got = select_queries(model(), state, asked, 8, strategy, context_ids=context)
        alone = [select_query(model(), state, q, 8, strategy, context_ids=context) for q in asked]
    weakest = peaks.index(min(peaks))
    for i, selection in enumerate(got):
        assert (selection.measured.get("deep") == 1.0) == (i == weakest)
    assert got[weakest].kept.tolist() == alone[weakest].kept.tolist()  # the deep answer does not depend on the others
