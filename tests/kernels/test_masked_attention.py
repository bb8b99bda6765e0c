"""A sliding layer's banded attention (kernels/masked_attention.sliding_attention) against `masked_attention` over
every key with the sliding mask written out."""

from __future__ import annotations

import pytest
import torch

from ilre.kernels.masked_attention import BAND_ROWS, masked_attention, sliding_attention


@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("window, chunk", [(16, 3 * BAND_ROWS + 5), (300, BAND_ROWS - 7), (BAND_ROWS, 2 * BAND_ROWS)])
def test_the_band_equals_the_written_out_mask(window, chunk, sinks):
    g = torch.Generator().manual_seed(window + chunk)
    heads, kv, dk, dv, seen = 4, 2, 8, 6, 1000
    ring = seen - 1 - torch.randperm(window - 1, generator=g)  # the ring's entries in slot order, not by position
    rows = torch.arange(seen, seen + chunk)
    at = torch.cat((ring, rows))
    q = torch.randn(heads, chunk, dk, generator=g)
    k, v = torch.randn(kv, at.numel(), dk, generator=g), torch.randn(kv, at.numel(), dv, generator=g)
    logits = torch.randn(heads, generator=g) if sinks else None
    visible = (at.unsqueeze(0) <= rows.unsqueeze(1)) & (at.unsqueeze(0) > rows.unsqueeze(1) - window)
    expected = masked_attention(q, k, v, visible, logits)
    got = sliding_attention(q, k, v, at, rows, window, logits)
    assert got.shape == (heads, chunk, dv)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
