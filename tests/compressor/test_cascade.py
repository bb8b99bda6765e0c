"""The cascade (coarse layer picks candidates, l_R ranks them) against literal references."""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from ilre.compressor.candidate_prefill import Streams, candidate_prefill
from tests.selecting import select_context, select_queries, select_query
from ilre.compressor.prefill import encode_context, prefill_query
from ilre.compressor.prefill_config import PrefillConfig
from ilre.compressor.strategies import make_strategy
from ilre.compressor.cascade_reading import FIRST_STREAM_TOKENS, pick_candidates, recent_share
from ilre.models.loader import load_truncated
from tests.reference import dense_candidate_prefill, dense_prefill, dense_scores, dense_stream, literal_algorithm1
from tests.tiny_models import N_LAYERS, random_ids, single_thread, tiny_checkpoint  # noqa: F401

LENGTH, N_QUERY, KERNELS = 90, 5, ((2, 4), (1, 3))
CONFIGS = [PrefillConfig(sink=4, window=8, chunk=16), PrefillConfig(sink=4, window=8, chunk=16, dca=True),
           PrefillConfig(sink=2, window=None, chunk=12, dca=True), PrefillConfig(sink=4, window=24, chunk=10)]


@lru_cache(maxsize=None)
def model(kind: str = "qwen2"):
    return load_truncated(tiny_checkpoint(kind), N_LAYERS)


def cascade(**options):
    return make_strategy("cascade", {"max_kernels": list(KERNELS[0]), "avg_kernels": list(KERNELS[1]), **options})


def plain_ilre(**options):
    return make_strategy("ilre", {"max_kernels": list(KERNELS[0]), "avg_kernels": list(KERNELS[1]), **options})


def literal_candidates(scores: list[float], count: int, sink: int, recent: int) -> list[int]:
    """The sink, the last `recent` tokens, and Algorithm 1 loop by loop over the tokens between them."""
    length = len(scores)
    if count >= length:
        return list(range(length))
    tail = min(recent, count - sink)
    middle = scores[sink:length - tail]
    picked = literal_algorithm1(middle, count - sink - tail, *KERNELS)
    return list(range(sink)) + [i + sink for i in picked] + list(range(length - tail, length))


def reference_kept(context, query, config: PrefillConfig, coarse: int, factor: float, budget: int,
                   weight: float, from_stream: bool = False) -> list[int]:
    """The cascade written out: the dense masked prefill to the coarse layer and its A^C, the literal
    candidates, the dense prefill of the candidates restricted by the Λ mask to l_R, A^C over them
    (zero elsewhere); each scaled to sum 1 outside the sink, the coarse one times `weight`, the larger
    of the two per token; then Algorithm 1 loop by loop after the sink. from_stream: the candidates and the
    query enter the coarse layer with the dense prefill's stream (an encoding that kept its stream)."""
    keys, queries = dense_prefill(model(), context, query, config, coarse)
    coarse_scores = dense_scores(queries, keys)
    count = int(-(-factor * budget // 1))
    recent = min(config.window or count, count // 8)
    candidates = literal_candidates(coarse_scores.tolist(), count, config.sink, recent)
    start = (coarse, dense_stream(model(), context, query, config, coarse)) if from_stream else None
    keys, queries = dense_candidate_prefill(model(), context, candidates, query, config, start)
    attention = torch.zeros(context.numel(), dtype=torch.float64)
    attention[candidates] = dense_scores(queries, keys)
    s = config.sink
    if weight > 0:
        attention = torch.maximum(attention / attention[s:].sum(), weight * coarse_scores / coarse_scores[s:].sum())
    picked = literal_algorithm1(attention[config.sink:].tolist(), budget - config.sink, *KERNELS)
    return list(range(config.sink)) + [i + config.sink for i in picked]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("candidates", [
    [0, 1, 2, 3, 4, 5, 20, 21, 22, 40, 41, 77, 88, 89],  # sparse, across chunks, some chunks empty
    list(range(0, 90, 3)) + [1, 2],  # every third token and the sink
    list(range(90)),  # the whole context
])
def test_candidate_prefill_matches_the_restricted_dense_prefill(config, candidates):
    context, query = random_ids(LENGTH, seed=1), random_ids(N_QUERY, seed=2)
    chosen = torch.tensor(sorted(set(candidates)))
    with torch.inference_mode():
        keys, queries = candidate_prefill(model(), context, chosen, query, config)
    ref_keys, ref_queries = dense_candidate_prefill(model(), context, chosen.tolist(), query, config)
    torch.testing.assert_close(keys, ref_keys, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(queries, ref_queries, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("config", CONFIGS)
def test_candidate_prefill_of_the_whole_context_is_the_streaming_prefill(config):
    context, query = random_ids(LENGTH, seed=3), random_ids(N_QUERY, seed=4)
    with torch.inference_mode():
        keys, queries = candidate_prefill(model(), context, torch.arange(LENGTH), query, config)
    ref_keys, ref_queries = dense_prefill(model(), context, query, config)
    torch.testing.assert_close(keys, ref_keys, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(queries, ref_queries, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("candidates", [[0, 1, 2, 3, 4, 5, 20, 21, 22, 40, 41, 77, 88, 89], list(range(90))])
def test_candidate_prefill_from_the_kept_stream_matches_the_restricted_dense_prefill(config, candidates):
    """From an encoding that kept its stream at the coarse layer (2): the streams are the dense prefill's, and the
    candidates run on from them as the dense prefill restricted to them from layer 2 on; over the whole context
    that is the streaming prefill at l_R itself."""
    context, query = random_ids(LENGTH, seed=1), random_ids(N_QUERY, seed=2)
    chosen = torch.tensor(candidates)
    with torch.inference_mode():
        state = encode_context(model(), context, config, (2,), keep_hidden=True)
        stream = prefill_query(model(), state, query).stream
        keys, queries = candidate_prefill(model(), context, chosen, query, config, Streams(2, state.hidden, [stream]))
    dense = dense_stream(model(), context, query, config, 2)
    torch.testing.assert_close(torch.cat((state.hidden, stream)), dense, atol=2e-5, rtol=1e-4)
    ref_keys, ref_queries = dense_candidate_prefill(model(), context, candidates, query, config, (2, dense))
    torch.testing.assert_close(keys, ref_keys, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(queries, ref_queries, atol=2e-5, rtol=1e-4)
    if len(candidates) == LENGTH:
        ref_keys, ref_queries = dense_prefill(model(), context, query, config)
        torch.testing.assert_close(keys, ref_keys, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(queries, ref_queries, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("config", CONFIGS[:3])
@pytest.mark.parametrize("factor, budget, coarse, weight", [(2.0, 20, 2, 0.5), (3.5, 16, 1, 0.0), (2.5, 9, 3, 0.5)])
def test_a_cascade_on_an_encoding_that_kept_its_stream_matches_the_literal_reference(config, factor, budget, coarse,
                                                                                     weight):
    """The candidates start at the coarse layer from the kept stream, one question or several sharing a pass."""
    context, queries = random_ids(LENGTH, seed=5), [random_ids(N_QUERY, seed=s) for s in (6, 16)]
    strategy = cascade(coarse_layer=coarse, candidates=factor, coarse_weight=weight)
    with torch.inference_mode():
        state = encode_context(model(), context, config, strategy.reading().encoded_layers(N_LAYERS), keep_hidden=True)
    one = select_query(model(), state, queries[0], budget, strategy, context_ids=context, stream=state.hidden)
    assert one.kept.tolist() == reference_kept(context, queries[0], config, coarse, factor, budget, weight, True)
    assert one.measured["from_layer"] == coarse
    shared = cascade(coarse_layer=2, candidates=2.0, coarse_weight=weight)  # a union of candidates cheaper than deep
    with torch.inference_mode():
        kept = encode_context(model(), context, config, shared.reading().encoded_layers(N_LAYERS), keep_hidden=True)
    both = select_queries(model(), kept, queries, 8, shared, context_ids=context, stream=kept.hidden)
    assert [s.measured["from_layer"] for s in both] == [2, 2] and all("deep" not in s.measured for s in both)
    plain = select_query(model(), state, queries[0], budget, strategy, context_ids=context)  # no stream: at layer 1
    assert "from_layer" not in plain.measured
    assert plain.kept.tolist() == reference_kept(context, queries[0], config, coarse, factor, budget, weight)


@pytest.mark.parametrize("count, recent", [(30, 3), (12, 0), (89, 11), (200, 8)])
def test_candidates_are_the_sink_the_recent_tokens_and_algorithm1(count, recent):
    scores = torch.rand(LENGTH, generator=torch.Generator().manual_seed(count))
    chosen = pick_candidates(scores, count, 4, recent, cascade().allocator).tolist()
    assert chosen == literal_candidates(scores.tolist(), count, 4, recent)
    assert chosen == sorted(set(chosen)) and len(chosen) == min(count, LENGTH)


@pytest.mark.parametrize("config", CONFIGS[:3])
@pytest.mark.parametrize("factor, budget, coarse, weight", [(2.0, 20, 2, 0.5), (3.5, 16, 1, 0.0), (1.0, 30, 3, 1.0),
                                                            (2.5, 9, 2, 0.5), (2.0, 20, 2, 0.0)])
@pytest.mark.parametrize("first_from_stream", [None, False])
def test_cascade_matches_the_literal_reference(config, factor, budget, coarse, weight, first_from_stream):
    """A first question: its candidates run on from the stream the coarse pass left (the default), or from layer 1
    (first_from_stream false)."""
    context, query = random_ids(LENGTH, seed=5), random_ids(N_QUERY, seed=6)
    strategy = cascade(coarse_layer=coarse, candidates=factor, coarse_weight=weight,
                       first_from_stream=first_from_stream)
    selection = select_context(model(), context, query, budget, strategy, config)
    kept, streamed = selection.kept.tolist(), first_from_stream is None
    assert kept == reference_kept(context, query, config, coarse, factor, budget, weight, streamed)
    assert len(kept) == budget and kept == sorted(set(kept))
    assert selection.measured.get("from_layer") == (coarse if streamed else None)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("weight", [0.0, 0.5])
def test_candidates_covering_the_context_give_ilre_at_l_r(config, weight):
    """Weight 0: plain ILRe at l_R; otherwise ILRe at l_R with the coarse layer in also_layers."""
    context, query = random_ids(LENGTH, seed=7), random_ids(N_QUERY, seed=8)
    ilre = plain_ilre(also_layers=[2], also_weight=weight) if weight else plain_ilre()
    plain = select_context(model(), context, query, 20, ilre, config).kept.tolist()
    strategy = cascade(coarse_layer=2, candidates=LENGTH / 20, coarse_weight=weight)  # 90 candidates: all of them
    # through the coarse layer and a candidate pass over everything
    with torch.inference_mode():
        state = encode_context(model(), context, config, strategy.reading().encoded_layers(N_LAYERS))
    assert select_query(model(), state, query, 20, strategy, context_ids=context).kept.tolist() == plain
    # and as the pipeline runs it: without the coarse layer at all
    whole = strategy.reading().for_context(LENGTH, 20).scorer
    assert whole.cascade_layer is None and whole.extra_layers == ((2,) if weight else ())
    assert select_context(model(), context, query, 20, strategy, config).kept.tolist() == plain
    assert strategy.reading().batchable and whole.reading().batchable  # the coarse layer (then each one's candidates) or l_R (+ l_c)


def test_cached_and_multi_query_selections_equal_uncached():
    config = PrefillConfig(sink=4, window=8, chunk=16, dca=True)
    context = random_ids(LENGTH, seed=9)
    queries = [random_ids(N_QUERY, seed=s) for s in (10, 11, 12)]
    strategy = cascade(coarse_layer=2, candidates=2.0, first_from_stream=False)  # the cached state keeps no stream
    with torch.inference_mode():
        state = encode_context(model(), context, config, strategy.reading().encoded_layers(N_LAYERS))
    again = [select_query(model(), state, q, 16, strategy, context_ids=context).kept.tolist() for q in queries]
    alone = [select_context(model(), context, q, 16, strategy, config).kept.tolist() for q in queries]
    assert again == alone
    assert len({tuple(k) for k in alone}) > 1  # the queries do choose differently


def test_the_encoded_context_holds_only_the_coarse_layer():
    strategy = cascade(coarse_layer=2)
    state = encode_context(model(), random_ids(LENGTH, seed=13), CONFIGS[0], strategy.reading().encoded_layers(N_LAYERS))
    assert set(state.keys) == {2} and len(state.caches) == 1


def test_a_first_question_streams_up_to_the_cap_unless_told_not_to():
    """The stream a first question's candidates start from is L x D for the request: kept up to FIRST_STREAM_TOKENS,
    never for a cascade whose candidates cover the context (every token runs to l_R anyway) or told not to."""
    strategy = cascade(coarse_layer=2)
    plan = strategy.reading()
    assert plan.streams_first(FIRST_STREAM_TOKENS) and not plan.streams_first(FIRST_STREAM_TOKENS + 1)
    assert not cascade(coarse_layer=2, first_from_stream=False).reading().streams_first(1000)
    assert not plan.for_context(100, 90).streams_first(100)  # whole: its candidates would cover the context
    assert not plain_ilre().reading().streams_first(1000)


def test_recent_share_is_an_eighth_within_the_window():
    assert recent_share(4096, PrefillConfig()) == 512
    assert recent_share(256, PrefillConfig()) == 32
    assert recent_share(8192, PrefillConfig(window=None)) == 1024


@pytest.mark.parametrize("options, field", [
    ({"candidates": 0.5}, "candidates"), ({"candidates": "many"}, "candidates"), ({"candidates": True}, "candidates"),
    ({"coarse_layer": 0}, "coarse_layer"), ({"coarse_layer": 2.5}, "coarse_layer"),
    ({"coarse_weight": -0.1}, "coarse_weight"), ({"coarse_weight": 1.5}, "coarse_weight"),
    ({"first_from_stream": "yes"}, "first_from_stream"), ({"first_from_stream": 1}, "first_from_stream"),
])
def test_bad_options_name_the_field(options, field):
    with pytest.raises(ValueError, match=rf"^{field}: "):
        make_strategy("cascade", options)


@pytest.mark.parametrize("coarse", [N_LAYERS, N_LAYERS + 3])
def test_a_coarse_layer_at_or_above_l_r_is_refused(coarse):
    with pytest.raises(ValueError, match=r"^coarse_layer: must be below l_R = 4"):
        select_context(model(), random_ids(LENGTH, seed=1), random_ids(N_QUERY, seed=2), 10,
                       cascade(coarse_layer=coarse), CONFIGS[0])


def test_profile_defaults_fill_only_what_the_request_left_unset():
    defaults = {"coarse_layer": 2, "candidates": 3.0}
    assert cascade().with_defaults(defaults) == cascade(coarse_layer=2, candidates=3.0)
    assert cascade(candidates=6).with_defaults(defaults) == cascade(coarse_layer=2, candidates=6)
    assert plain_ilre().with_defaults(defaults) == plain_ilre()


def test_a_profiles_coarse_weight_is_applied_unless_the_request_sets_one():
    profile = {"coarse_layer": 2, "candidates": 2.0, "coarse_weight": 0.25}
    assert cascade().with_defaults(profile).weight == 0.25
    assert cascade(coarse_weight=0.5).with_defaults(profile).weight == 0.5  # the request's own
    assert cascade(coarse_weight=0.0).with_defaults(profile).weight == 0.0
    assert cascade().weight == 0.5  # neither says: the default
    context, query, config = random_ids(LENGTH, seed=71), random_ids(N_QUERY, seed=72), CONFIGS[0]
    from_profile = select_context(model(), context, query, 20, cascade().with_defaults(profile), config)
    quarter = select_context(model(), context, query, 20, cascade(coarse_layer=2, candidates=2.0, coarse_weight=0.25), config)
    half = select_context(model(), context, query, 20, cascade(coarse_layer=2, candidates=2.0), config)
    torch.testing.assert_close(from_profile.scores, quarter.scores, rtol=0, atol=0)
    assert not torch.equal(from_profile.scores, half.scores)


def test_whole_is_the_cascades_own_and_refused_as_a_request_option():
    with pytest.raises(ValueError, match=r"^strategy_options\.whole: cascade does not take whole"):
        make_strategy("cascade", {"whole": True})
    assert cascade().with_defaults({"whole": True}).whole is False  # nor may a profile set it
    assert cascade(coarse_layer=2).reading().for_context(LENGTH, 80).scorer.whole  # the strategy sets it for itself


def test_a_coarse_layer_at_or_above_l_r_is_refused_on_a_short_context_too():
    with pytest.raises(ValueError, match=r"^coarse_layer: must be below l_R = 4"):
        select_context(model(), random_ids(LENGTH, seed=1), random_ids(N_QUERY, seed=2), 40,
                       cascade(coarse_layer=N_LAYERS), CONFIGS[0])  # 160 candidates: the whole context


def _stream_pass(state, context, query, candidates, config, memo=None, coarse=2):
    stream = prefill_query(model(), state, query).stream
    return candidate_prefill(model(), context, torch.tensor(candidates), query, config,
                             Streams(coarse, state.hidden, [stream]), memo)


@pytest.mark.parametrize("config", CONFIGS)
def test_a_pass_over_held_rows_matches_the_dense_prefill_that_reads_them(config):
    """A candidate pass leaves its rows (K/V at layers l_c..l_R-1, l_R keys) in the context's memo; the next pass
    from the stream runs only the candidates not held and reads the others' K/V from there: the dense masked
    prefill of its candidates with the held rows' K/V put in at every layer matches it. The memo then holds the
    second pass's candidates."""
    context, query, other = random_ids(LENGTH, seed=1), random_ids(N_QUERY, seed=2), random_ids(N_QUERY, seed=7)
    first = [0, 1, 2, 3, 4, 5, 20, 21, 22, 40, 41, 60, 61, 77, 88, 89]
    second = [0, 1, 2, 3, 4, 6, 20, 22, 23, 40, 41, 50, 51, 77, 80, 88, 89]
    with torch.inference_mode():
        state = encode_context(model(), context, config, (2,), keep_hidden=True)
        memo = state.row_memo()
        _stream_pass(state, context, other, first, config, memo)
        rows = memo.rows
        assert rows.positions.tolist() == first and rows.first == 2 and rows.keys.shape[0] == N_LAYERS - 2
        keys, queries = _stream_pass(state, context, query, second, config, memo)
    assert memo.reused == len(set(first) & set(second)) and memo.rows.positions.tolist() == second
    dense = dense_stream(model(), context, query, config, 2)
    ref_keys, ref_queries = dense_candidate_prefill(model(), context, second, query, config, (2, dense), rows)
    torch.testing.assert_close(keys, ref_keys, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(queries, ref_queries, atol=2e-5, rtol=1e-4)
    exact_keys, _ = dense_candidate_prefill(model(), context, second, query, config, (2, dense))
    assert not torch.allclose(keys, exact_keys, atol=1e-4)  # an approximation: the held rows saw other candidates


@pytest.mark.parametrize("config", CONFIGS)
def test_held_rows_of_the_same_candidates_or_of_those_before_give_the_pass_without_them(config):
    """Exact where the held rows saw what they would see in this pass: the same candidates again (bit for bit, only
    the query runs), or the first of this pass's candidates (the rest come after them: nothing they saw differs)."""
    context, query, other = random_ids(LENGTH, seed=3), random_ids(N_QUERY, seed=4), random_ids(N_QUERY, seed=8)
    chosen = [0, 1, 2, 3, 7, 8, 30, 31, 32, 55, 70, 71, 85, 86, 87, 88, 89]
    with torch.inference_mode():
        state = encode_context(model(), context, config, (2,), keep_hidden=True)
        want = _stream_pass(state, context, query, chosen, config)
        memo = state.row_memo()
        _stream_pass(state, context, other, chosen, config, memo)
        again = _stream_pass(state, context, query, chosen, config, memo)
        assert memo.reused == len(chosen)
        torch.testing.assert_close(again, want, atol=0, rtol=0)
        memo.rows = None
        _stream_pass(state, context, other, chosen[:9], config, memo)
        after = _stream_pass(state, context, query, chosen, config, memo)
        assert memo.reused == 9
    torch.testing.assert_close(after, want, atol=2e-5, rtol=1e-4)


def test_a_pass_from_layer_1_leaves_rows_from_the_coarse_layer_and_a_state_without_its_stream_has_no_memo():
    config = CONFIGS[1]
    context, query = random_ids(LENGTH, seed=5), random_ids(N_QUERY, seed=6)
    chosen = [0, 1, 2, 3, 10, 11, 50, 51, 52, 89]
    with torch.inference_mode():
        state = encode_context(model(), context, config, (2,), keep_hidden=True)
        bare = state.nbytes
        memo = state.row_memo()
        keys, _ = candidate_prefill(model(), context, torch.tensor(chosen), query, config, None, memo)
        assert memo.reused == 0 and memo.rows.first == 2 and memo.rows.keys.shape[:3] == (N_LAYERS - 2, 2, len(chosen))
        assert state.nbytes == bare + memo.rows.nbytes > bare  # counted with the state
        assert state.take_hidden() is not None and state.rows is None and state.row_memo() is None
        plain = encode_context(model(), context, config, (2,))
        assert plain.row_memo() is None
