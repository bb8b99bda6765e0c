"""Blockwise eqs. 4-5 scoring against a dense softmax over all context keys."""

from __future__ import annotations

import pytest
import torch

from tests.tiny_models import single_thread  # noqa: F401 (autouse)

from ilre.kernels.query_scores import query_key_scores
from ilre.kernels.rope import MovedKeys, rerotate
from tests.reference import dense_scores

N_KV, LENGTH, N_QUERY, DIM = 2, 23, 3, 16


def make(group: int, scale: float, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = scale * torch.randn(N_KV * group, N_QUERY, DIM, generator=gen)  # (H, Lq, d)
    keys = torch.randn(N_KV, LENGTH, DIM, generator=gen)  # (KV, L, d)
    return q, keys


@pytest.mark.parametrize("group", [1, 2, 3])
@pytest.mark.parametrize("block", [1, 7, LENGTH, 64])
def test_scores_equal_dense_softmax(group, block):
    q, keys = make(group, scale=2.0)
    got = query_key_scores(q, keys, block=block)  # (L,)
    assert got.shape == (LENGTH,) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), dense_scores(q, keys), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("block", [1, 5, 64])
def test_scores_stable_with_huge_logits(block):
    q, keys = make(2, scale=200.0, seed=1)  # logits in the thousands: needs the running max
    got = query_key_scores(q, keys, block=block)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), dense_scores(q, keys), rtol=1e-4, atol=1e-6)


def test_scores_use_the_right_kv_group():
    # head 0 and 1 belong to kv head 0, heads 2 and 3 to kv head 1. Make kv head 1 favour token 4
    # strongly and only heads 2-3 point at it: token 4 must win; with the wrong grouping it would not.
    q = torch.zeros(4, 1, DIM)
    keys = torch.zeros(2, 8, DIM)
    keys[1, 4, 0] = 10.0
    q[2:, 0, 0] = 10.0
    got = query_key_scores(q, keys, block=3)
    assert got.argmax().item() == 4
    assert got[4].item() == pytest.approx(1.0, abs=1e-6)
    torch.testing.assert_close(got.double(), dense_scores(q, keys), rtol=1e-5, atol=1e-7)


def test_scores_uniform_for_zero_queries():
    q = torch.zeros(2, 2, DIM)
    keys = torch.randn(1, 10, DIM)
    torch.testing.assert_close(query_key_scores(q, keys, block=4), torch.full((10,), 0.1))


@pytest.mark.parametrize("block", [1, 4, 64])
@pytest.mark.parametrize("spans", [((0, 9, 14), (9, 14, 9)), ((0, 3, 20), (5, 11, -4)), ((0, LENGTH, 7),)],
                         ids=["dca", "gaps", "all"])
def test_moved_keys_score_as_the_moved_copy(block, spans):
    """DCA's moved keys (MovedKeys: the query moved back per span, the keys never copied) score as the moved
    copy does against a dense softmax, with gaps between spans, blocks across span ends and one span of all."""
    q, keys = make(3, scale=2.0, seed=2)
    moved = MovedKeys(keys, spans, rope_inv_freq(DIM))
    copy = moved.moved()
    for start, end, shift in spans:
        torch.testing.assert_close(copy[:, start:end], rerotate(keys[:, start:end], moved.inv_freq, shift))
    assert not torch.allclose(copy, keys)  # not vacuous: the spans moved the keys
    torch.testing.assert_close(query_key_scores(q, moved, block=block).double(), dense_scores(q, copy),
                               rtol=1e-5, atol=1e-7)


def rope_inv_freq(dim: int, base: float = 10000.0) -> torch.Tensor:
    return 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
