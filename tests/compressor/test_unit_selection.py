"""Whole-unit selection (compressor/unit_selection.py) against the literal loop in tests/reference.py."""

from __future__ import annotations

import random

import pytest
import torch

from ilre.compressor.allocation import PoolingAllocator
from ilre.compressor.strategies import make_strategy
from ilre.compressor.unit_selection import select_units
from tests.reference import literal_select_units


def random_case(rng: random.Random, length: int, max_unit: int, budget: int, sink: int):
    """Integer scores (float32 sums exact), random unit bounds, a random token selection of `budget` indices."""
    scores = [float(rng.randrange(50)) for _ in range(length)]
    bounds = sorted({0, length, *(rng.randrange(1, length) for _ in range(length // max_unit + 1))})
    tokens = sorted(set(range(min(sink, budget))) | set(rng.sample(range(sink, length), budget - min(sink, budget))))
    return scores, bounds, tokens


@pytest.mark.parametrize("seed", range(40))
def test_equals_the_literal_loop(seed):
    rng = random.Random(seed)
    length = rng.randrange(20, 400)
    sink = rng.choice([0, 1, 4])
    budget = rng.randrange(sink + 1, length)
    scores, bounds, tokens = random_case(rng, length, rng.choice([1, 3, 8, 40]), budget, sink)
    if seed % 2:  # scores of either sign (cosines, a head's predictions)
        scores = [s - 25.0 for s in scores]
    got = select_units(torch.tensor(scores), torch.tensor(bounds), torch.tensor(tokens), sink).tolist()
    assert got == literal_select_units(scores, bounds, tokens, sink)
    assert len(got) == budget and got == sorted(set(got))  # the budget exactly, sorted unique indices
    assert got[: min(sink, budget)] == list(range(min(sink, budget)))
    kept = set(got)
    cuts = sorted({min(max(b, sink), length) for b in bounds} | {sink, length})
    partial = [(a, z) for a, z in zip(cuts, cuts[1:]) if 0 < len(kept & set(range(a, z))) < z - a]
    assert len(partial) <= 1  # every kept unit whole but the one trimmed


def random_heads(rng: random.Random, bounds: list[int]) -> list[tuple[int, int]]:
    """Up to three tables over disjoint random runs of units (as tables are runs of lines): each a header
    of one or two units, then rows."""
    heads = [(-1, -1)] * (len(bounds) - 1)
    first = rng.randrange(len(heads))
    while first < len(heads) and sum(h != (-1, -1) for h in set(heads)) < 3:
        head_units = rng.choice([1, 2])
        last = min(first + head_units + rng.randrange(0, 12), len(heads))
        span = (bounds[first], bounds[min(first + head_units, len(heads))])
        for u in range(first, last):
            heads[u] = span
        first = last + rng.randrange(0, 6)
    return heads


@pytest.mark.parametrize("seed", range(60))
def test_with_table_headers_equals_the_literal_loop(seed):
    rng = random.Random(1000 + seed)
    length = rng.randrange(20, 400)
    sink = rng.choice([0, 1, 4])
    budget = rng.randrange(sink + 1, length)
    scores, bounds, tokens = random_case(rng, length, rng.choice([1, 3, 8, 40]), budget, sink)
    heads = random_heads(rng, bounds)
    got = select_units(torch.tensor(scores), torch.tensor(bounds), torch.tensor(tokens), sink,
                       torch.tensor(heads, dtype=torch.int64)).tolist()
    assert got == literal_select_units(scores, bounds, tokens, sink, heads)
    assert len(got) == budget and got == sorted(set(got))  # the budget exactly, sorted unique indices


def test_a_kept_row_brings_its_header_and_pays_for_it():
    scores = torch.zeros(100)
    scores[75] = 9.0  # the asked row [70, 80) of a table whose header is [20, 30)
    bounds = torch.arange(0, 101, 10)
    heads = torch.full((10, 2), -1)
    heads[2:9] = torch.tensor([20, 30])  # the header unit and the six rows under it
    tokens = torch.tensor([0, 1, 2, 3, *range(72, 78), *range(40, 50), *range(90, 94)])  # a budget of 24
    got = select_units(scores, bounds, tokens, 4, heads).tolist()
    assert got == [0, 1, 2, 3, *range(20, 30), *range(70, 80)]  # the row first, with its header: 4 + 10 + 10
    # with 4 tokens less, the row fits and its header does not: the row whole, the header's first 6 tokens
    assert select_units(scores, bounds, tokens[:-4], 4, heads).tolist() == [0, 1, 2, 3, *range(20, 26), *range(70, 80)]
    assert select_units(scores, bounds, tokens, 4).tolist() == [0, 1, 2, 3, *range(40, 50), *range(70, 80)]
    # a header inside the sink costs nothing more
    heads[2:9] = torch.tensor([0, 4])
    assert select_units(scores, bounds, tokens, 4, heads).tolist() == [0, 1, 2, 3, *range(40, 50), *range(70, 80)]


def test_one_token_units_give_the_strategys_own_selection():
    scores = torch.rand(3000, generator=torch.Generator().manual_seed(3))
    for name in ("ilre", "snapkv", "streaming_llm"):
        strategy = make_strategy(name)
        tokens = strategy.select(scores, 300, 4)
        got = select_units(scores, torch.arange(3001), tokens, 4)
        assert torch.equal(got, tokens), name
    allocator = PoolingAllocator()
    assert torch.equal(select_units(scores, torch.arange(3001), allocator.allocate(scores, 256), 0),
                       allocator.allocate(scores, 256))


def test_the_unit_with_the_best_token_is_kept_whole():
    scores = torch.zeros(100)
    scores[57] = 9.0  # a needle inside unit [50, 60)
    bounds = torch.tensor([0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100])
    tokens = torch.tensor([0, 1, 2, 3, 56, 57, 58, 59])  # the token selection keeps a fragment around it
    # room for 4 tokens only: the needle's unit is the one trimmed, to a window around its best token
    assert select_units(scores, bounds, tokens, 4).tolist() == [0, 1, 2, 3, 55, 56, 57, 58]
    got = select_units(scores, bounds, torch.tensor([0, 1, 2, 3, *range(52, 62)]), 4).tolist()
    assert got == [0, 1, 2, 3, *range(50, 60)]
