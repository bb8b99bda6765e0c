"""One question moved to several contexts (compressor/shared_query.py) against the references it stands for: the
query moved by RoPE scores as the keys moved back would, the conversation's last context selects exactly as its own
query pass does, and a context's keys alone select as its whole encoding does."""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from ilre.compressor.context_state import ContextState
from tests.selecting import select_query
from ilre.compressor.prefill import encode_context, prefill_query
from ilre.compressor.prefill_config import PrefillConfig
from ilre.compressor.shared_query import SharedQuestionJob, moved_queries, select_shared
from ilre.compressor.strategies import make_strategy
from ilre.kernels.query_scores import query_key_scores
from ilre.kernels.rope import MovedKeys
from ilre.models.loader import load_truncated
from tests.tiny_models import N_LAYERS, random_ids, single_thread, tiny_checkpoint  # noqa: F401

CONFIG = PrefillConfig(sink=2, window=5, chunk=7)
STRATEGIES = [("ilre", {}), ("ilre", {"also_layers": [2]}), ("snapkv", {}),
              ("cascade", {"coarse_layer": 2, "candidates": 2.0})]


@lru_cache(maxsize=None)
def model():
    return load_truncated(tiny_checkpoint("llama"), N_LAYERS)


def test_a_question_moved_by_rope_scores_as_the_keys_moved_back():
    torch.manual_seed(0)
    q, keys = torch.randn(4, 3, 16), torch.randn(2, 40, 16)
    inv_freq = model().inv_freq[:8]  # a head dim of 16
    for shift in (0, 7, 300, -25):
        moved = moved_queries({1: q}, inv_freq, shift)[1]
        back = MovedKeys(keys, ((0, 40, -shift),), inv_freq).moved()  # R(-s) k, copied
        torch.testing.assert_close(query_key_scores(moved, keys), query_key_scores(q, back), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,options", STRATEGIES)
def test_the_last_context_selects_as_its_own_query_pass(name, options):
    """Shift 0 and its own windows: the shared path is the lone path, to the bit."""
    context, query = random_ids(33, seed=3), random_ids(4, seed=4)
    strategy = make_strategy(name, options).reading().for_context(33, 6).scorer
    layers = strategy.reading().encoded_layers(N_LAYERS)
    state = encode_context(model(), context, CONFIG, layers)
    lone = select_query(model(), state, query, 6, strategy, context_ids=context)
    asked = prefill_query(model(), state, query)
    (shared,) = select_shared(model(), asked, 33, [SharedQuestionJob(state.keys_only(), context, 6, strategy)], query)
    assert shared.kept.tolist() == lone.kept.tolist()
    torch.testing.assert_close(shared.scores, lone.scores)


@pytest.mark.parametrize("name,options", STRATEGIES)
def test_keys_alone_select_as_the_whole_encoding_and_travel_as_tensors(name, options):
    contexts = [random_ids(n, seed=n) for n in (30, 19, 41)]
    query = random_ids(3, seed=9)
    strategy = make_strategy(name, options)
    layers = strategy.reading().encoded_layers(N_LAYERS)
    states = [encode_context(model(), c, CONFIG, layers) for c in contexts]
    asked = prefill_query(model(), states[-1], query)
    at = contexts[-1].numel()

    def selections(of: list[ContextState]):
        jobs = [SharedQuestionJob(s, c, 6, strategy.reading().for_context(c.numel(), 6).scorer) for s, c in zip(of, contexts)]
        return [s.kept.tolist() for s in select_shared(model(), asked, at, jobs, query)]

    restored = [ContextState.from_tensors(model(), CONFIG, s.keys_only().to_tensors()) for s in states]
    assert all(not r.caches and not r.has_windows and r.resume is None for r in restored)
    assert selections(states) == selections([s.keys_only() for s in states]) == selections(restored)
    assert all(len(kept) == 6 for kept in selections(states))


def test_a_query_pass_needs_the_windows():
    state = encode_context(model(), random_ids(30, seed=1), CONFIG).keys_only()
    with pytest.raises(ValueError, match="window caches were not kept"):
        prefill_query(model(), state, random_ids(3, seed=2))
