"""One streamed chunk over [prefix | itself causally] against dense masked attention."""

from __future__ import annotations

import math

import pytest
import torch

from tests.tiny_models import single_thread  # noqa: F401 (autouse)

from ilre.kernels import chunk_attention as chunk_attention_module
from ilre.kernels.chunk_attention import chunk_attention, torch_chunk_attention


def dense_chunk_attention(q, k, v, n_prefix, visible=None):
    """q: (H, C, d); k, v: (KV, P + C, d) -> (H, C, d) with an explicit mask and repeated KV."""
    n_chunk = q.shape[1]
    group = q.shape[0] // k.shape[0]
    k_rep, v_rep = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)  # (H, P+C, d)
    mask = torch.zeros(n_chunk, n_prefix + n_chunk, dtype=torch.bool)
    for i in range(n_chunk):
        for j in range(n_prefix):
            mask[i, j] = True if visible is None else bool(visible[j])  # the prefix entries that exist
        mask[i, n_prefix : n_prefix + i + 1] = True  # the chunk causally
    logits = (q.double() @ k_rep.double().transpose(1, 2)) / math.sqrt(q.shape[-1])
    return torch.softmax(logits.masked_fill(~mask, -math.inf), -1) @ v_rep.double()


@pytest.mark.parametrize("path", ["as_run", "cpu_flash_merged", "lower_right_bias"])
@pytest.mark.parametrize("n_prefix", [0, 1, 5])
@pytest.mark.parametrize("group", [1, 2, 3])
def test_chunk_attention_equals_dense(n_prefix, group, path, monkeypatch):
    if path == "lower_right_bias":  # the path of CUDA/NPU devices, forced here on the CPU
        monkeypatch.setattr(chunk_attention_module, "_CPU_FLASH", None)
    gen = torch.Generator().manual_seed(n_prefix * 10 + group)
    n_kv, n_chunk, dim = 2, 6, 8
    q = 2 * torch.randn(n_kv * group, n_chunk, dim, generator=gen)  # (H, C, d)
    k = torch.randn(n_kv, n_prefix + n_chunk, dim, generator=gen)  # (KV, P+C, d)
    v = torch.randn(n_kv, n_prefix + n_chunk, dim, generator=gen)
    attend = chunk_attention if path == "as_run" else torch_chunk_attention  # as run: the C kernel where it builds
    got = attend(q, k, v, n_prefix)
    assert got.shape == q.shape
    torch.testing.assert_close(got.double(), dense_chunk_attention(q, k, v, n_prefix), atol=1e-5, rtol=1e-5)


def test_first_query_of_chunk_ignores_later_chunk_tokens():
    # with no prefix, the first query sees only its own token: output = its own value
    q, k = torch.randn(2, 4, 8), torch.randn(1, 4, 8)
    v = torch.arange(32.0).view(1, 4, 8)
    out = chunk_attention(q, k, v, 0)
    torch.testing.assert_close(out[:, 0], v[0, 0].expand(2, 8))


@pytest.mark.parametrize("visible", [[1, 0, 0, 1, 1], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
def test_chunk_attention_with_holes_in_the_prefix(visible):
    # short inputs: the sink or the window is not full yet, the missing entries are masked out
    gen = torch.Generator().manual_seed(7)
    q, k, v = torch.randn(4, 3, 8, generator=gen), torch.randn(2, 8, 8, generator=gen), torch.randn(2, 8, 8, generator=gen)
    mask = torch.tensor(visible, dtype=torch.bool)
    got = chunk_attention(q, k, v, 5, mask)
    torch.testing.assert_close(got.double(), dense_chunk_attention(q, k, v, 5, mask), atol=1e-5, rtol=1e-5)


def test_bfloat16_chunk_attention_is_close_to_float64():
    gen = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(6, 16, 8, generator=gen), torch.randn(2, 40, 8, generator=gen), torch.randn(2, 40, 8, generator=gen)
    got = chunk_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), 24)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), dense_chunk_attention(q, k, v, 24), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("rows", [[0, 2, 5], [3], [0, 1, 2, 3, 4, 5]])
@pytest.mark.parametrize("n_prefix", [0, 4])
def test_some_rows_of_a_chunk_equal_those_rows_of_the_whole_chunk(rows, n_prefix):
    """q holding only some rows of the chunk (the rest's K/V read from elsewhere): each row as in the whole chunk."""
    gen = torch.Generator().manual_seed(11 + n_prefix)
    q, k, v = torch.randn(4, 6, 8, generator=gen), torch.randn(2, n_prefix + 6, 8, generator=gen), torch.randn(
        2, n_prefix + 6, 8, generator=gen)
    some = torch.tensor(rows)
    got = chunk_attention(q[:, some], k, v, n_prefix, rows=some)
    assert got.shape == (4, len(rows), 8)
    torch.testing.assert_close(got.double(), dense_chunk_attention(q, k, v, n_prefix)[:, some], atol=1e-5, rtol=1e-5)
