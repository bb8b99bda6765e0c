"""l_R selection: recall per layer from one pass equals per-layer compression; smallest best layer."""

from __future__ import annotations

import torch

from ilre.compressor.calibration import needle_kept, pick_layer, recall_by_layer
from tests.selecting import select_context
from ilre.compressor.prefill import streaming_prefill
from ilre.compressor.prefill_config import PrefillConfig
from ilre.compressor.strategies import make_strategy
from ilre.models.loader import load_truncated
from tests.tiny_models import N_LAYERS, random_ids, single_thread, tiny_checkpoint  # noqa: F401


def test_pick_layer_takes_the_smallest_of_the_best():
    assert pick_layer({1: 0.2, 2: 0.9, 3: 0.9, 4: 0.5}) == 2
    assert pick_layer({5: 1.0, 3: 0.0, 9: 1.0}) == 5
    assert pick_layer({1: 0.0, 2: 0.0}) == 1


def test_needle_kept_needs_every_token():
    kept = torch.tensor([0, 1, 2, 10, 11, 12, 20])
    assert needle_kept(kept, (10, 13))
    assert not needle_kept(kept, (10, 14))
    assert not needle_kept(kept, (19, 21))


def test_one_pass_recall_matches_compressing_at_each_layer():
    config = PrefillConfig(sink=2, window=6, chunk=10)
    context, query = random_ids(70, seed=3), random_ids(4, seed=4)
    strategies = {"multi": make_strategy("ilre"), "single": make_strategy("snapkv")}
    budget = 20
    full = load_truncated(tiny_checkpoint("llama"), N_LAYERS)
    state = streaming_prefill(full, context, query, config, tuple(range(1, N_LAYERS + 1)))
    for needle in [(30, 33), (2, 4), (60, 70)]:
        recalls = recall_by_layer(state, needle, budget, config.sink, strategies)
        for layer in range(1, N_LAYERS + 1):
            model = load_truncated(tiny_checkpoint("llama"), layer)
            for name, strategy in strategies.items():
                kept = select_context(model, context, query, budget, strategy, config).kept
                assert recalls[name][layer] == needle_kept(kept, needle), (name, layer, needle)


def test_ties_at_short_range_are_broken_by_long_context_recall():
    from ilre.compressor.calibration import pick_layers

    short = {6: 0.6, 8: 1.0, 15: 0.95, 18: 1.0, 19: 1.0, 21: 1.0}
    long = {6: 0.2, 8: 0.5, 15: 0.9, 18: 0.9, 19: 0.9, 21: 0.7}
    assert pick_layers(short, long) == {"fast": 8, "default": 18, "robust": 18}
    long[15] = 0.95  # the best long-context layer need not be tied at short range
    assert pick_layers(short, long) == {"fast": 8, "default": 18, "robust": 15}
    assert pick_layers(short, None) == {"fast": 8, "default": 8, "robust": 8}  # no long grid: the paper's rule
    assert pick_layers({3: 1.0, 5: 1.0}, {3: 0.0, 5: 0.0}) == {"fast": 3, "default": 3, "robust": 3}


def test_the_cascade_cost_counts_layer_tokens_and_the_factor_is_the_largest_within_the_cap():
    from ilre.compressor.calibration import cascade_cost, pick_candidate_factor

    assert cascade_cost(8, 19, 4.0, 1024, 32768) == (8 * 32768 + 19 * 4096) / (8 * 32768)  # 1.297
    assert cascade_cost(8, 19, 64.0, 1024, 32768) == (8 * 32768 + 19 * 32768) / (8 * 32768)  # capped at the context
    costs = {f: round(cascade_cost(8, 19, f, 1024, 32768), 3) for f in (1.0, 2.0, 3.0, 4.0, 6.0, 8.0)}
    assert pick_candidate_factor(costs) == 4.0
    assert pick_candidate_factor({2.0: 1.5, 4.0: 2.0}) == 2.0  # none within the cap: the cheapest
