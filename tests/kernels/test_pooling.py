"""Max and average pooling of Algorithm 1 on hand-computed examples."""

from __future__ import annotations

import pytest
import torch

from tests.tiny_models import single_thread  # noqa: F401 (autouse)

from ilre.kernels.pooling import block_max_pool, same_length_avg_pools


def test_block_max_pool_with_partial_last_block():
    scores = torch.tensor([1.0, 5.0, 2.0, 3.0, 9.0, 0.0, 4.0])  # blocks [1,5,2] [3,9,0] [4]
    assert block_max_pool(scores, 3).tolist() == [5.0, 9.0, 4.0]
    assert block_max_pool(scores, 2).tolist() == [5.0, 3.0, 9.0, 4.0]


def test_block_max_pool_exact_multiple_and_oversized_kernel():
    scores = torch.tensor([0.5, 0.25, 0.75, 0.125])
    assert block_max_pool(scores, 2).tolist() == [0.5, 0.75]
    assert block_max_pool(scores, 4).tolist() == [0.75]
    assert block_max_pool(scores, 100).tolist() == [0.75]


def test_block_max_pool_size_one_is_identity():
    scores = torch.tensor([3.0, -1.0, 2.0])
    assert block_max_pool(scores, 1).tolist() == [3.0, -1.0, 2.0]


def test_block_max_pool_negative_scores_not_beaten_by_padding():
    scores = torch.tensor([-3.0, -2.0, -5.0])  # partial last block [-5]
    assert block_max_pool(scores, 2).tolist() == [-2.0, -5.0]


def test_same_length_avg_pools_hand_computed():
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    pooled = same_length_avg_pools(values, [1, 2, 3, 4])  # (4, 5)
    assert pooled.shape == (4, 5)
    expected = [
        [1.0, 2.0, 3.0, 4.0, 5.0],  # n=1: itself
        [1.5, 2.5, 3.5, 4.5, 5.0],  # n=2: [i, i+1]
        [1.5, 2.0, 3.0, 4.0, 4.5],  # n=3: [i-1, i+1]
        [2.0, 2.5, 3.5, 4.0, 4.5],  # n=4: [i-1, i+2]
    ]
    assert pooled.tolist() == expected


def test_same_length_avg_pools_kernel_longer_than_input():
    values = torch.tensor([2.0, 4.0, 9.0])
    # n=16: window [i-7, i+8] covers everything for every i
    assert same_length_avg_pools(values, [16]).tolist() == [[5.0, 5.0, 5.0]]
    # n=5: [i-2, i+2] also covers everything
    assert same_length_avg_pools(values, (5,)).tolist() == [[5.0, 5.0, 5.0]]


def test_same_length_avg_pools_is_float64_and_single_element():
    pooled = same_length_avg_pools(torch.tensor([0.1], dtype=torch.float32), [1, 2, 7])
    assert pooled.dtype == torch.float64
    assert pooled.shape == (3, 1)
    assert torch.equal(pooled, torch.full((3, 1), float(torch.tensor(0.1, dtype=torch.float32))))


@pytest.mark.parametrize("n", [1, 2, 3, 6, 9])
def test_same_length_avg_pools_matches_loop(n):
    values = torch.rand(23, generator=torch.Generator().manual_seed(n))
    got = same_length_avg_pools(values, [n])[0]
    for i in range(23):
        window = values[max(0, i - (n - 1) // 2) : min(23, i + n // 2 + 1)].double()
        assert got[i].item() == pytest.approx(window.mean().item(), rel=1e-12)
