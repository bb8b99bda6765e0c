"""The cascade's fallback: when l_R attends to nothing strongly among the candidates (`deepen_below`), the
whole context runs to l_R and the query is scored as the deepened form scores it. Checked against the
statistic written out, the deepened form computed on its own, and the caller's encoding being used."""

from __future__ import annotations

import math

import pytest
import torch

from ilre.compressor.candidate_prefill import Streams, candidate_prefill
from tests.selecting import select_context, select_query
from ilre.compressor.prefill import encode_context, prefill_query, resume_context
from ilre.compressor.prefill_config import PrefillConfig
from ilre.compressor.strategies import make_strategy
from ilre.compressor.reading import QueryPass, Reading
from ilre.compressor.cascade_reading import peak_strength, pick_candidates, recent_share
from ilre.kernels.query_scores import query_key_scores
from tests.tiny_models import N_LAYERS, random_ids

from .test_cascade import CONFIGS, LENGTH, N_QUERY, cascade, model

BUDGET, COARSE, FACTOR = 16, 2, 2.0


def literal_peak(context: torch.Tensor, query: torch.Tensor, config: PrefillConfig) -> float:
    """The statistic step by step: the coarse layer's A^C picks the candidates, they run on to l_R from the stream
    the coarse pass left, and the mean of the five largest of l_R's A^C over the candidates outside the sink,
    summed in a Python loop."""
    strategy = cascade(coarse_layer=COARSE, candidates=FACTOR)
    with torch.inference_mode():
        state = encode_context(model(), context, config, (COARSE,), keep_hidden=True)
        retrieval = prefill_query(model(), state, query)
        coarse = query_key_scores(retrieval.queries[COARSE], retrieval.keys[COARSE])
        count = strategy.reading().candidate_count(BUDGET)
        candidates = pick_candidates(coarse, count, config.sink, recent_share(count, config), strategy.allocator)
        keys, queries = candidate_prefill(model(), context, candidates, query, config,
                                          Streams(COARSE, state.hidden, [retrieval.stream]))
        over = query_key_scores(queries, keys).tolist()
    outside = sorted((v for c, v in zip(candidates.tolist(), over) if c >= config.sink), reverse=True)
    total = 0.0
    for value in outside[:5]:
        total += value
    return total / 5


def literal_coarse_peak(context: torch.Tensor, query: torch.Tensor, config: PrefillConfig) -> float:
    """The coarse layer's own peak strength step by step: its A^C over the whole context, the mean of the five
    largest outside the sink, summed in a Python loop."""
    with torch.inference_mode():
        state = encode_context(model(), context, config, (COARSE,))
        retrieval = prefill_query(model(), state, query)
        coarse = query_key_scores(retrieval.queries[COARSE], retrieval.keys[COARSE]).tolist()
    total = 0.0
    for value in sorted(coarse[config.sink:], reverse=True)[:5]:
        total += value
    return total / 5


def kept(strategy, context, query, config) -> list[int]:
    return select_context(model(), context, query, BUDGET, strategy, config).kept.tolist()


def test_peak_strength_is_the_mean_of_the_five_largest():
    assert peak_strength(torch.tensor([0.1, 0.9, 0.2, 0.8, 0.3, 0.7, 0.05])) == pytest.approx((0.9 + 0.8 + 0.7 + 0.3 + 0.2) / 5)
    assert peak_strength(torch.tensor([0.4, 0.2])) == pytest.approx(0.3)  # fewer than five: all of them
    assert peak_strength(torch.tensor([])) == 0.0


@pytest.mark.parametrize("config", CONFIGS[:3])
def test_the_fallback_is_taken_exactly_below_the_threshold(config):
    context, query = random_ids(LENGTH, seed=21), random_ids(N_QUERY, seed=22)
    peak = literal_peak(context, query, config)
    assert 0.0 < peak < 1.0
    candidates_only = kept(cascade(coarse_layer=COARSE, candidates=FACTOR), context, query, config)
    deepened = kept(cascade(coarse_layer=COARSE, candidates=FACTOR).reading().deepened(), context, query, config)
    assert candidates_only != deepened  # the two paths choose differently here, so the test tells them apart
    above = cascade(coarse_layer=COARSE, candidates=FACTOR, deepen_below=peak * 0.999)
    below = cascade(coarse_layer=COARSE, candidates=FACTOR, deepen_below=min(1.0, peak * 1.001))
    assert kept(above, context, query, config) == candidates_only
    assert kept(below, context, query, config) == deepened
    never = cascade(coarse_layer=COARSE, candidates=FACTOR, deepen_below=0.0)
    assert kept(never, context, query, config) == candidates_only


def test_the_selection_reports_the_peak_it_measured_whether_or_not_it_fell_back():
    config = CONFIGS[0]
    context, query = random_ids(LENGTH, seed=21), random_ids(N_QUERY, seed=22)
    peak = literal_peak(context, query, config)
    for deepen_below in (0.0, 1.0):
        strategy = cascade(coarse_layer=COARSE, candidates=FACTOR, deepen_below=deepen_below)
        selection = select_context(model(), context, query, BUDGET, strategy, config)
        assert selection.measured == {"peak": pytest.approx(peak, rel=1e-5),
                                      "coarse_peak": pytest.approx(literal_coarse_peak(context, query, config), rel=1e-5),
                                      "from_layer": COARSE, **({"deep": 1.0} if peak < deepen_below else {})}
    whole = select_context(model(), context, query, BUDGET, cascade(coarse_layer=COARSE, candidates=FACTOR).reading().deepened(), config)
    assert whole.measured == {}  # no candidates, so nothing to measure


def test_the_fallback_equals_plain_ilre_at_l_r_with_the_coarse_layer_blended():
    config = CONFIGS[1]
    context, query = random_ids(LENGTH, seed=23), random_ids(N_QUERY, seed=24)
    blended = make_strategy("ilre", {"max_kernels": [2, 4], "avg_kernels": [1, 3], "also_layers": [COARSE],
                                     "also_weight": 0.5})
    always = cascade(coarse_layer=COARSE, candidates=FACTOR, deepen_below=1.0)
    assert kept(always, context, query, config) == kept(blended, context, query, config)


def test_the_callers_encoding_is_read_once_and_only_on_the_fallback():
    config = CONFIGS[0]
    context, queries = random_ids(LENGTH, seed=25), [random_ids(N_QUERY, seed=s) for s in (26, 27)]
    strategy = cascade(coarse_layer=COARSE, candidates=FACTOR, deepen_below=1.0)
    deep = strategy.reading().deepened()
    calls = []

    def deepened():
        calls.append(1)
        return encode_context(model(), context, config, deep.reading().encoded_layers(N_LAYERS))

    with torch.inference_mode():
        state = encode_context(model(), context, config, strategy.reading().encoded_layers(N_LAYERS))
    for query in queries:
        got = select_query(model(), state, query, BUDGET, strategy, context_ids=context, deepened=deepened)
        assert got.kept.tolist() == kept(deep, context, query, config)
    assert len(calls) == 2  # once per query that fell back
    never = cascade(coarse_layer=COARSE, candidates=FACTOR, deepen_below=0.0)
    select_query(model(), state, queries[0], BUDGET, never, context_ids=context, deepened=deepened)
    assert len(calls) == 2


@pytest.mark.parametrize("weight", [0.5, 1.0])
def test_with_deepen_blend_the_candidates_attention_joins_the_whole_contexts_on_the_fallback(weight):
    config = CONFIGS[0]
    context, query = random_ids(LENGTH, seed=21), random_ids(N_QUERY, seed=22)
    strategy = cascade(coarse_layer=COARSE, candidates=FACTOR, deepen_below=1.0, deepen_blend=weight)
    with torch.inference_mode():
        state = encode_context(model(), context, config, strategy.reading().encoded_layers(N_LAYERS))
        retrieval = prefill_query(model(), state, query)
        got, _ = strategy.reading().attention(QueryPass(model(), retrieval, context, query, BUDGET, config))
        # literal: l_R's A^C over the candidates (zero elsewhere) and over the whole context, each scaled to
        # sum 1 outside the sink, the candidates' times the weight, the larger of the two per token
        coarse = query_key_scores(retrieval.queries[COARSE], retrieval.keys[COARSE])
        count = strategy.reading().candidate_count(BUDGET)
        candidates = pick_candidates(coarse, count, config.sink, recent_share(count, config), strategy.allocator)
        keys, queries = candidate_prefill(model(), context, candidates, query, config)
        over = dict(zip(candidates.tolist(), query_key_scores(queries, keys).tolist()))
        deep = encode_context(model(), context, config, strategy.reading().deepened().reading().encoded_layers(N_LAYERS))
        whole = query_key_scores(prefill_query(model(), deep, query).queries[N_LAYERS], deep.keys[N_LAYERS]).tolist()
    found = [over.get(i, 0.0) for i in range(LENGTH)]
    found_sum, whole_sum = sum(found[config.sink:]), sum(whole[config.sink:])
    expected = [max(w / whole_sum, weight * f / found_sum) for w, f in zip(whole, found)]
    assert got.tolist() == pytest.approx(expected, rel=1e-4, abs=1e-7)
    plain = cascade(coarse_layer=COARSE, candidates=FACTOR, deepen_below=1.0)
    assert kept(strategy, context, query, config) != kept(plain, context, query, config)  # the blend changes the choice here
    never = cascade(coarse_layer=COARSE, candidates=FACTOR, deepen_below=0.0, deepen_blend=weight)
    assert kept(never, context, query, config) == kept(cascade(coarse_layer=COARSE, candidates=FACTOR), context, query,
                                                       config)  # no fallback: nothing to blend


@pytest.mark.parametrize("config", CONFIGS[:3])
def test_the_coarse_rule_falls_back_exactly_below_its_threshold_without_the_candidate_pass(config, monkeypatch):
    context, query = random_ids(LENGTH, seed=21), random_ids(N_QUERY, seed=22)
    coarse_peak = literal_coarse_peak(context, query, config)
    assert 0.0 < coarse_peak < 1.0
    candidates_only = kept(cascade(coarse_layer=COARSE, candidates=FACTOR), context, query, config)
    deepened = kept(cascade(coarse_layer=COARSE, candidates=FACTOR).reading().deepened(), context, query, config)
    assert candidates_only != deepened
    above = cascade(coarse_layer=COARSE, candidates=FACTOR, coarse_below=coarse_peak * 0.999)
    below = cascade(coarse_layer=COARSE, candidates=FACTOR, coarse_below=min(1.0, coarse_peak * 1.001))
    assert kept(above, context, query, config) == candidates_only
    runs = []
    import ilre.compressor.cascade_reading as module
    monkeypatch.setattr(module, "candidate_prefill", lambda *a, **k: runs.append(1) or candidate_prefill(*a, **k))
    selection = select_context(model(), context, query, BUDGET, below, config)
    assert selection.kept.tolist() == deepened and runs == []  # decided before any candidate ran to l_R
    assert set(selection.measured) == {"coarse_peak", "deep"}


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("rule", [{"deepen_below": 1.0}, {"coarse_below": 1.0}])
def test_a_fallback_resumed_from_the_coarse_encoding_selects_what_a_fresh_deep_encoding_selects(config, rule, monkeypatch):
    """select_context keeps the coarse encoding's resume point and takes it on to l_R (layers 1..l_c once); the
    selection equals the fallback on an encoding made from scratch, exactly (float32)."""
    context, query = random_ids(LENGTH, seed=41), random_ids(N_QUERY, seed=42)
    strategy = cascade(coarse_layer=COARSE, candidates=FACTOR, **rule)
    deep = strategy.reading().deepened()

    def fresh():
        return encode_context(model(), context, config, deep.reading().encoded_layers(N_LAYERS))

    with torch.inference_mode():
        state = encode_context(model(), context, config, strategy.reading().encoded_layers(N_LAYERS))
        want = select_query(model(), state, query, BUDGET, strategy, context_ids=context, deepened=fresh)
    import ilre.compressor.pipeline as pipeline
    resumes = []
    monkeypatch.setattr(pipeline, "resume_context", lambda *a, **k: resumes.append(1) or resume_context(*a, **k))
    got = select_context(model(), context, query, BUDGET, strategy, config)
    assert got.kept.tolist() == want.kept.tolist() == kept(deep, context, query, config)
    assert resumes == [1]
    torch.testing.assert_close(got.scores, want.scores, atol=0, rtol=0)


@pytest.mark.parametrize("value", [-0.1, 1.5, "high", True, float("nan")])
def test_a_bad_threshold_names_the_field(value):
    with pytest.raises(ValueError, match=r"^coarse_below: "):
        make_strategy("cascade", {"coarse_below": value})
    with pytest.raises(ValueError, match=r"^deepen_below: "):
        make_strategy("cascade", {"deepen_below": value})
    with pytest.raises(ValueError, match=r"^deepen_blend: "):
        make_strategy("cascade", {"deepen_blend": value})


def test_the_profile_fills_the_threshold_only_when_the_request_leaves_it_unset():
    assert cascade().with_defaults({"deepen_below": 0.6}) == cascade(deepen_below=0.6)
    assert cascade(deepen_below=0.0).with_defaults({"deepen_below": 0.6}) == cascade(deepen_below=0.0)
    assert cascade().with_defaults({"deepen_blend": 0.5}) == cascade(deepen_blend=0.5)
    assert cascade(deepen_blend=0.0).with_defaults({"deepen_blend": 0.5}) == cascade(deepen_blend=0.0)


def test_many_questions_pay_for_depth_once_where_their_candidate_pass_costs_more():
    """The cost rule written out: l_R x |U| (layer-tokens of the shared candidate pass) against (l_R - l_c) x L
    (the whole context read on from the coarse layer); a request keeps the resume point when its questions'
    candidates could cost that much together."""
    strategy = cascade(coarse_layer=8, candidates=4.0)
    for length, union in ((32768, 18971), (32768, 18972), (131072, 4096), (131072, 75882), (131072, 75883)):
        assert strategy.reading().deep_pays(length, union, 19) == (19 * union >= 11 * length)
    for length, budget, questions in ((32768, 1024, 1), (32768, 1024, 4), (32768, 1024, 5), (131072, 1024, 18),
                                      (131072, 1024, 19), (3000, 512, 20), (50000, 64, 2)):
        count = min(math.ceil(4.0 * budget), length)
        expected = questions >= 2 and 19 * min(length, questions * count) >= (19 - 8) * length
        assert strategy.reading().reads_deep(length, budget, questions, 19) == expected
    assert cascade(coarse_layer=8, deepen_below=0.5).reading().reads_deep(32768, 1024, 1, 19)  # a fallback may read it
    assert type(strategy.reading().deepened().reading()) is Reading  # already whole: a plain reading, nothing to pay for
