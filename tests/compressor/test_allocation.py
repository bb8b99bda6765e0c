"""PoolingAllocator (vectorised Algorithm 1) against a literal loop-by-loop implementation."""

from __future__ import annotations

import pytest
import torch

from ilre.compressor.allocation import PoolingAllocator, combination_budgets, top_k_indices
from tests.reference import literal_algorithm1
from tests.tiny_models import single_thread  # noqa: F401 (autouse)

PAPER = ((2, 4, 8), tuple(range(1, 17)))
SNAPKV = ((1,), (5,))
ODD_SETS = [((3, 5), (2, 4, 7)), ((1, 2), (1,)), ((7,), (16,)), ((8, 2), (3, 1)), ((1,), (1, 2, 3, 4))]


def random_scores(length: int, seed: int) -> torch.Tensor:
    """(L,) float32 in [0, 1), every value a multiple of 2^-24: float64 sums of them are exact,
    so the literal loop and the cumulative-sum pooling agree bit for bit (no rounding ties)."""
    return torch.rand(length, generator=torch.Generator().manual_seed(seed))


def check(scores: torch.Tensor, budget: int, max_kernels, avg_kernels) -> list[int]:
    got = PoolingAllocator(max_kernels, avg_kernels).allocate(scores, budget)
    assert got.dtype == torch.int64
    got = got.tolist()
    expected = literal_algorithm1(scores.double().tolist(), budget, max_kernels, avg_kernels)
    assert got == expected
    assert len(got) == min(budget, scores.numel())
    assert len(set(got)) == len(got) and got == sorted(got)
    assert all(0 <= i < scores.numel() for i in got)
    return got


def budgets_for(length: int) -> list[int]:
    candidates = [0, 1, 2, 47, 48, 49, 100, 513, length - 1, length, length + 3]
    return sorted({b for b in candidates if 0 <= b <= length + 3})


@pytest.mark.parametrize("length", [17, 101, 1000])
def test_paper_kernels_match_literal_algorithm(length):
    scores = random_scores(length, seed=length)
    for budget in budgets_for(length):
        check(scores, budget, *PAPER)


@pytest.mark.parametrize("budget", [1, 49, 513, 1500, 3000])
def test_paper_kernels_match_literal_algorithm_long(budget):
    check(random_scores(3001, seed=3001), budget, *PAPER)


@pytest.mark.parametrize("kernels", [SNAPKV, *ODD_SETS], ids=str)
@pytest.mark.parametrize("length", [17, 101, 1000])
def test_other_kernel_sets_match_literal_algorithm(kernels, length):
    scores = random_scores(length, seed=length + 1)
    for budget in budgets_for(length):
        check(scores, budget, *kernels)


@pytest.mark.parametrize("kernels", [PAPER, SNAPKV, ((3, 5), (2, 4, 7))], ids=["paper", "snapkv", "odd"])
@pytest.mark.parametrize("levels", [1, 2, 4])
def test_many_exact_ties_match_literal_algorithm(kernels, levels):
    # scores from a handful of values: ties everywhere, resolved by the lower index
    gen = torch.Generator().manual_seed(levels)
    scores = torch.randint(0, levels, (301,), generator=gen).float() / 4
    for budget in (1, 7, 48, 50, 150, 300):
        check(scores, budget, *kernels)


def test_all_equal_scores_keep_the_first_tokens_for_snapkv():
    # every pooled score ties, ties go to the lower index: the first B tokens
    assert PoolingAllocator(*SNAPKV).allocate(torch.full((20,), 0.5), 6).tolist() == [0, 1, 2, 3, 4, 5]


def test_fill_from_raw_scores_when_candidates_run_out():
    # one combination, m=8 over L=17: blocks [0,8) [8,16) [16]. B=15 -> K_m = 15 // 8 + 1 = 2 blocks.
    # The partial block {16} scores highest, block 0 next: the combination proposes only 9 tokens,
    # the other 6 come from the highest raw scores among the rest (tokens 10..15).
    scores = torch.tensor([0.9] * 8 + [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8] + [1.0])
    got = PoolingAllocator((8,), (1,)).allocate(scores, 15).tolist()
    assert got == [0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15, 16]
    assert got == literal_algorithm1(scores.tolist(), 15, (8,), (1,))


def test_snapkv_hand_example():
    # m=1, n=3: pooled[i] = mean of scores[i-1..i+1] clipped
    #   = [0, 1/4, 1/4, 1/3, 1/6, 1/4, 1/6, 1/8]; ranked 3, then the 1/4 ties by index: 1, 2, 5.
    # Budget 3 keeps {1, 2, 3}; plain top-3 of the raw scores would be {2, 4, 5}.
    scores = torch.tensor([0.0, 0.0, 0.75, 0.0, 0.25, 0.25, 0.25, 0.0])
    assert PoolingAllocator((1,), (3,)).allocate(scores, 3).tolist() == [1, 2, 3]
    assert top_k_indices(scores, 3).tolist() == [2, 4, 5]


def test_combination_budgets_sum_to_budget():
    for budget in (0, 1, 47, 48, 49, 1000, 4096):
        shares = combination_budgets(budget, 48)
        assert sum(shares) == budget and max(shares) - min(shares) <= 1


def test_top_k_indices_ties_by_lower_index():
    scores = torch.tensor([0.1, 0.5, 0.5, 0.9, 0.5])
    assert top_k_indices(scores, 3).tolist() == [1, 2, 3]


@pytest.mark.parametrize("kwargs", [{"max_kernels": ()}, {"avg_kernels": (0,)}, {"max_kernels": (2, -1)}])
def test_allocator_rejects_bad_kernels(kwargs):
    field = next(iter(kwargs))
    with pytest.raises(ValueError, match=f"^{field}:"):
        PoolingAllocator(**kwargs)


@pytest.mark.parametrize("n, k", [(1, 1), (50, 7), (4096, 513), (4096, 4096), (4096, 0), (300, 299)])
def test_the_top_k_ranking_equals_the_head_of_the_full_stable_sort(n, k):
    """_top_ranked (a top-k, then a sort of those alone) returns what a full stable descending sort starts with,
    ties by lower index: values drawn from a few levels, so most are tied."""
    from ilre.compressor.allocation import _ranked, _top_ranked

    generator = torch.Generator().manual_seed(n + k)
    for values in (torch.randint(0, 5, (n,), generator=generator).float(), torch.rand(n, generator=generator)):
        assert torch.equal(_top_ranked(values, k), _ranked(values)[:k])


@pytest.mark.parametrize("n, k", [(50, 7), (1024, 300), (1025, 300), (3000, 3000), (200, 0)])
def test_rows_ranked_together_equal_each_row_ranked_alone(n, k):
    """_top_ranked_rows sorts short rows in one call and ranks long ones one by one: either way each row's
    ranking is `_top_ranked`'s (ties by lower index)."""
    from ilre.compressor.allocation import ROWS_SORTED, _top_ranked, _top_ranked_rows

    assert (n <= ROWS_SORTED) == (n <= 1024)  # both paths are exercised by these sizes
    generator = torch.Generator().manual_seed(n + k)
    for values in (torch.randint(0, 4, (16, n), generator=generator).float(), torch.rand(16, n, generator=generator)):
        ranked = _top_ranked_rows(values, k)
        assert ranked.shape == (16, min(k, n))
        for row, got in zip(values, ranked):
            assert torch.equal(got, _top_ranked(row, k))
