"""One contract for every registered strategy, through the pipeline on a tiny model."""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from tests.selecting import select_context
from ilre.compressor.prefill import streaming_prefill
from ilre.compressor.prefill_config import PrefillConfig
from ilre.compressor.strategies import STRATEGIES, make_strategy
from ilre.kernels.query_scores import query_key_scores
from ilre.models.loader import load_truncated
from ilre.models.retaining_head import RetainingHead
from tests.reference import literal_algorithm1
from tests.tiny_models import random_ids, single_thread, tiny_checkpoint  # noqa: F401

CONFIG = PrefillConfig(sink=4, window=8, chunk=16)
LENGTH, N_QUERY = 60, 5
BUDGETS = [1, 3, 4, 5, 17, 33, LENGTH - 1]


@lru_cache(maxsize=None)
def model():
    """The tiny model at layer 2, with a (seeded, untrained) retaining head for Locret."""
    truncated = load_truncated(tiny_checkpoint("qwen2"), 2)
    truncated.retaining_head = RetainingHead.for_spec(truncated.spec, 8, seed=3).requires_grad_(False)
    return truncated


def inputs(seed: int = 0):
    return random_ids(LENGTH, seed=seed), random_ids(N_QUERY, seed=seed + 1)


def test_registry_names_match_classes():
    assert set(STRATEGIES) >= {"ilre", "snapkv", "streaming_llm"}
    for name, cls in STRATEGIES.items():
        assert cls.name == name


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@pytest.mark.parametrize("budget", BUDGETS)
def test_strategy_contract(name, budget):
    context, query = inputs()
    selection = select_context(model(), context, query, budget, make_strategy(name), CONFIG)
    kept = selection.kept.tolist()
    assert selection.kept.dtype == torch.int64
    assert len(kept) == budget  # exactly the budget when L > budget
    assert kept == sorted(set(kept))  # unique, ascending
    assert all(0 <= i < LENGTH for i in kept)
    sink = min(CONFIG.sink, budget)
    assert kept[:sink] == list(range(sink))  # the sink is always kept first
    assert not selection.passthrough


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@pytest.mark.parametrize("budget", [LENGTH, LENGTH + 10])
def test_passthrough_when_context_fits(name, budget):
    context, query = inputs()
    selection = select_context(model(), context, query, budget, make_strategy(name), CONFIG)
    assert selection.passthrough
    assert selection.kept.tolist() == list(range(LENGTH))


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_strategy_is_deterministic_and_stateless(name):
    strategy = make_strategy(name)
    context, query = inputs(3)
    first = select_context(model(), context, query, 20, strategy, CONFIG).kept
    select_context(model(), *inputs(5), 31, strategy, CONFIG)  # another request in between
    assert torch.equal(select_context(model(), context, query, 20, strategy, CONFIG).kept, first)


def attention_scores(context, query):
    """A^C (L,) exactly as the pipeline computes it (streaming prefill at l_R, eqs. 4-5)."""
    state = streaming_prefill(model(), context, query, CONFIG)
    return query_key_scores(state.queries[2], state.keys[2])


@pytest.mark.parametrize(
    "name, options, kernels",
    [
        ("ilre", {}, ((2, 4, 8), tuple(range(1, 17)))),
        ("ilre", {"max_kernels": [3], "avg_kernels": [1, 2]}, ((3,), (1, 2))),
        ("snapkv", {}, ((1,), (5,))),
        ("snapkv", {"kernel_size": 2}, ((1,), (2,))),
    ],
)
@pytest.mark.parametrize("budget", [5, 17, 33])
def test_attention_strategies_apply_algorithm1_after_the_sink(name, options, kernels, budget):
    context, query = inputs(7)
    kept = select_context(model(), context, query, budget, make_strategy(name, options), CONFIG).kept.tolist()
    scores = attention_scores(context, query)[CONFIG.sink :].double().tolist()  # sink excluded
    picked = literal_algorithm1(scores, budget - CONFIG.sink, *kernels)
    assert kept == list(range(CONFIG.sink)) + [i + CONFIG.sink for i in picked]


@pytest.mark.parametrize("budget", [1, 4, 5, 30])
def test_streaming_llm_keeps_sink_and_most_recent(budget):
    context, query = inputs()
    kept = select_context(None, context, query, budget, make_strategy("streaming_llm"), CONFIG).kept.tolist()
    sink = min(CONFIG.sink, budget)
    assert kept == list(range(sink)) + list(range(LENGTH - (budget - sink), LENGTH))


@pytest.mark.parametrize("name", [n for n, cls in STRATEGIES.items() if cls.needs_attention])
def test_attention_strategies_need_a_model(name):
    with pytest.raises(ValueError, match="^strategy:"):
        select_context(None, *inputs(), 10, make_strategy(name), CONFIG)


def test_unknown_strategy_names_the_field():
    with pytest.raises(ValueError, match=r"^strategy: .*'nope'"):
        make_strategy("nope")


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_unknown_option_names_the_field_and_the_option(name):
    with pytest.raises(ValueError, match=r"^strategy_options.bogus: .*bogus"):
        make_strategy(name, {"bogus": 1})


def test_allocator_is_not_an_option():
    with pytest.raises(ValueError, match="^strategy_options.allocator:"):
        make_strategy("ilre", {"allocator": None})


@pytest.mark.parametrize(
    "name, options, field",
    [
        ("ilre", {"max_kernels": []}, "max_kernels"),
        ("ilre", {"max_kernels": 3}, "max_kernels"),
        ("ilre", {"avg_kernels": [0]}, "avg_kernels"),
        ("ilre", {"avg_kernels": ["a"]}, "avg_kernels"),
        ("ilre", {"max_kernels": [2.5]}, "max_kernels"),
        ("snapkv", {"kernel_size": 0}, "kernel_size"),
        ("snapkv", {"kernel_size": "x"}, "kernel_size"),
        ("snapkv", {"kernel_size": True}, "kernel_size"),
    ],
)
def test_bad_option_values_name_the_option(name, options, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        make_strategy(name, options)
