"""RoPE tables and re-rotation: R(shift) R(p) k = R(p + shift) k, checked against float64 truth."""

from __future__ import annotations

import math

import pytest
import torch

from tests.tiny_models import single_thread  # noqa: F401 (autouse)

from ilre.kernels.rope import apply_rope, rerotate, rerotate_into, rope_cos_sin, rotate_half

DIM = 16
INV_FREQ = 1.0 / (10000.0 ** (torch.arange(0, DIM, 2, dtype=torch.float32) / DIM))  # (d/2,)


def rope64(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """x: (heads, T, d) -> float64 rotation of each pair (x_i, x_{i+d/2}) by angle p * f_i."""
    angle = positions.double()[:, None] * inv_freq.double()[None, :]  # (T, d/2)
    x1, x2 = x.double().chunk(2, dim=-1)
    return torch.cat((x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()), dim=-1)


def product_rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    cos, sin = rope_cos_sin(INV_FREQ, positions)
    return apply_rope(x, cos, sin)


def angle_tolerance(x: torch.Tensor, *angles: int) -> float:
    """float32 computes p * f and cos/sin of it with a relative angle error ~2^-24: allow a few
    such errors per rotation, scaled by the largest component of x."""
    return 4.0 * x.abs().max().item() * (sum(abs(a) for a in angles) * 2.0**-24 + 1e-6)


@pytest.fixture
def x() -> torch.Tensor:
    return torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(0))  # (kv, T, d)


@pytest.mark.parametrize("start", [0, 3, 1000])
def test_rope_matches_float64_rotation(x, start):
    positions = torch.arange(start, start + 5)
    got = product_rope(x, positions)
    torch.testing.assert_close(got.double(), rope64(x, positions, INV_FREQ), atol=angle_tolerance(x, start + 5), rtol=0)


def test_rope_scaling_multiplies_cos_and_sin():
    cos, sin = rope_cos_sin(INV_FREQ, torch.arange(4))
    cos2, sin2 = rope_cos_sin(INV_FREQ, torch.arange(4), scaling=1.5)
    torch.testing.assert_close(cos2, 1.5 * cos)
    torch.testing.assert_close(sin2, 1.5 * sin)


@pytest.mark.parametrize(
    "start, shift",
    [(0, 1), (0, 7), (5, -3), (20, -20), (3, 1024), (1000, -999), (0, 100000), (100000, -100000), (7, -100000)],
)
def test_rerotate_composes(x, start, shift):
    positions = torch.arange(start, start + 5)
    moved = rerotate(product_rope(x, positions), INV_FREQ, shift)  # (kv, T, d)
    tol = angle_tolerance(x, start + 5, shift, start + 5 + shift)
    # against the product's own rope at p + shift, and against the float64 truth
    torch.testing.assert_close(moved, product_rope(x, positions + shift), atol=tol, rtol=0)
    torch.testing.assert_close(moved.double(), rope64(x, positions + shift, INV_FREQ), atol=tol, rtol=0)


def test_rerotate_tight_for_small_positions(x):
    moved = rerotate(product_rope(x, torch.arange(5)), INV_FREQ, 11)
    torch.testing.assert_close(moved, product_rope(x, torch.arange(11, 16)), atol=1e-5, rtol=1e-5)


def test_rerotate_back_and_forth_is_identity(x):
    there = rerotate(x, INV_FREQ, 12345)
    assert not torch.allclose(there, x, atol=1e-2)  # it did move
    torch.testing.assert_close(rerotate(there, INV_FREQ, -12345), x, atol=angle_tolerance(x, 12345, 12345), rtol=0)


def test_rerotate_keeps_norm_of_each_pair(x):
    moved = rerotate(x, INV_FREQ, 77)
    half = DIM // 2
    pair_norm = lambda t: (t[..., :half] ** 2 + t[..., half:] ** 2).sqrt()  # (kv, T, d/2)
    torch.testing.assert_close(pair_norm(moved), pair_norm(x), atol=1e-5, rtol=1e-5)


def test_rerotate_zero_shift_is_identity(x):
    assert torch.equal(rerotate(x, INV_FREQ, 0), x)


def test_rerotate_half_turn_of_lowest_frequency_pair():
    # pair 0 has frequency 1 rad/position: a shift of round(pi) rotates by ~pi -> (a, b) ~ (-a, -b)
    k = torch.zeros(1, 1, DIM)
    k[0, 0, 0], k[0, 0, DIM // 2] = 1.0, 2.0
    moved = rerotate(k, INV_FREQ, 3)
    expected = torch.tensor([math.cos(3) - 2 * math.sin(3), 2 * math.cos(3) + math.sin(3)])
    torch.testing.assert_close(moved[0, 0, [0, DIM // 2]], expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("shift", [0, 7, 3000, -41])
def test_rerotate_into_a_slice_equals_rerotate(x, shift):
    """DCA's bulk move: written into a slice of a larger tensor, the same keys as rerotate's to float rounding."""
    out = torch.full((x.shape[0], x.shape[1] + 3, x.shape[2]), float("nan"))
    rerotate_into(out[:, 1:-2], x, INV_FREQ, shift)
    torch.testing.assert_close(out[:, 1:-2], rerotate(x, INV_FREQ, shift), atol=1e-6, rtol=1e-6)
    assert out[:, 0].isnan().all() and out[:, -2:].isnan().all()  # nothing written beside the slice


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_rope_rounds_as_the_textbook_formula_bit_for_bit(dtype):
    """Written in place to halve its passes, the rotation still rounds a product and then a sum: selections made with
    x * cos + rotate_half(x) * sin do not move."""
    x = torch.randn(3, 2, 37, 64, generator=torch.Generator().manual_seed(1)).to(dtype)  # (batch, heads, T, d)
    cos, sin = (t.to(dtype) for t in rope_cos_sin(1.0 / (10000.0 ** (torch.arange(0, 64, 2) / 64)), torch.arange(37)))
    assert torch.equal(apply_rope(x, cos, sin), x * cos + rotate_half(x) * sin)
