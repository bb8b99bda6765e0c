"""The C layer passes (kernels/layer_passes.py) against the PyTorch operators they replace, and a decoder layer with
them against the same layer with PyTorch's operators."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ilre.kernels import layer_passes
from ilre.kernels.native_build import compile_flags, compiler, cpu_flags, fast_build
from ilre.kernels.rope import apply_rope
from ilre.models.llama import DecoderLayer
from ilre.models.spec import ModelSpec

# where a C compiler exists a failed build fails these tests (the first names why)
pytestmark = pytest.mark.skipif(compiler() is None or not fast_build(compile_flags(), cpu_flags()),
                                reason="no C compiler (gcc), or a build PyTorch's operators beat (x86-64-v2)")


def test_the_passes_build_where_a_compiler_exists():
    assert layer_passes.enabled(), f"the C layer passes did not build: {layer_passes.failure()}"

DTYPES = (torch.float32, torch.bfloat16)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def torch_norm(x: torch.Tensor, weight: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    normed = F.rms_norm(x, x.shape[-1:], eps=1e-5).to(dtype)
    return normed if weight is None else weight * normed


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(300, 576), (2, 37, 72), (1, 20)])
def test_rms_norm_is_pytorchs_up_to_the_row_sums_last_bits(dtype, shape):
    x = torch.randn(shape, generator=_gen(1)) * 3
    weight = torch.randn(shape[-1], generator=_gen(2)).to(dtype)
    for w in (weight, None):
        got, want = layer_passes.rms_norm(x, w, 1e-5, dtype), torch_norm(x, w, dtype)
        assert got.dtype == dtype and got.shape == x.shape
        if dtype == torch.float32:
            torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-6)
        else:  # a row's scale in float32's last bits: a rare element rounds to the neighbouring bfloat16
            assert (got != want).float().mean() < 1e-3
            torch.testing.assert_close(got.float(), want.float(), rtol=8e-3, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_residual_sum_is_exact_and_its_norm_the_norms(dtype):
    h = torch.randn(3, 50, 96, generator=_gen(3))
    out = torch.randn(3, 50, 96, generator=_gen(4)).to(dtype)
    weight = torch.randn(96, generator=_gen(5)).to(dtype)
    total, normed = layer_passes.residual(h, out, (weight, 1e-5))
    assert total.dtype == torch.float32 and torch.equal(total, h + out)
    torch.testing.assert_close(normed.float(), torch_norm(h + out, weight, dtype).float(),
                               rtol=2e-6 if dtype == torch.float32 else 8e-3, atol=1e-6)
    only, none = layer_passes.residual(h, out)
    assert none is None and torch.equal(only, h + out)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_is_pytorchs_silu_then_product(dtype):
    gate_up = (torch.randn(2, 129, 2 * 200, generator=_gen(6)) * 4).to(dtype)
    gate, up = gate_up.clone().chunk(2, dim=-1)
    want = torch.mul(F.silu(gate, inplace=True), up)
    got = layer_passes.silu_mul(gate_up)
    if dtype == torch.bfloat16 and not layer_passes._silu_bf16:  # built without avx512_bf16: PyTorch's is the faster
        assert got is None
    elif dtype == torch.bfloat16:  # every rounding PyTorch makes, bit for bit (exp's last float32 bits do not reach it)
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=3e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_heads_is_apply_rope_bit_for_bit_head_major(dtype):
    tokens, heads, rotated, d = 77, 15, 12, 64
    x = torch.randn(tokens, heads * d, generator=_gen(7)).to(dtype)
    cos, sin = torch.randn(2, tokens, d, generator=_gen(8)).to(dtype)
    got = layer_passes.rope_heads(x, cos, sin, heads, rotated)
    split = x.view(tokens, heads, d).transpose(0, 1)
    assert got.shape == (heads, tokens, d) and got.is_contiguous()
    assert torch.equal(got[:rotated], apply_rope(split[:rotated], cos, sin))
    assert torch.equal(got[rotated:], split[rotated:])


def test_what_the_passes_do_not_take_is_left_to_pytorch(monkeypatch):
    x = torch.randn(8, 16)
    assert layer_passes.rms_norm(x.half(), None, 1e-5, torch.float32) is None  # not a float32 stream
    assert layer_passes.rms_norm(x, None, 1e-5, torch.float16) is None
    assert layer_passes.rms_norm(x.t(), None, 1e-5, torch.float32) is None  # not contiguous
    assert layer_passes.rms_norm(x, torch.ones(16).bfloat16(), 1e-5, torch.float32) is None  # weight of another dtype
    assert layer_passes.silu_mul(torch.randn(4, 7)) is None  # no [gate | up] halves
    assert layer_passes.residual(x, torch.randn(8, 15)) is None
    assert layer_passes.rope_heads(torch.randn(2, 4, 64), torch.randn(4, 32), torch.randn(4, 32), 2, 1) is None  # batch
    assert layer_passes.rope_heads(torch.randn(4, 96), torch.randn(4, 3), torch.randn(4, 3), 32, 32) is None  # odd d
    assert layer_passes.rms_norm(x.requires_grad_(), None, 1e-5, torch.float32) is None  # no backward in C
    with torch.no_grad():
        assert layer_passes.rms_norm(x, None, 1e-5, torch.float32) is not None
    monkeypatch.setenv("ILRE_NATIVE_PASSES", "0")
    assert layer_passes.rms_norm(x.detach(), None, 1e-5, torch.float32) is None


SPEC = ModelSpec(model_type="llama", vocab_size=64, hidden_size=96, intermediate_size=160, num_layers=2, num_heads=6,
                 num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, native_context=512, qkv_bias=False, o_bias=False,
                 mlp_bias=False, qk_norm=False)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_decoder_layer_computes_what_it_does_with_pytorchs_operators(dtype, monkeypatch):
    torch.manual_seed(9)
    layer = DecoderLayer(SPEC).to(dtype)
    for norm in (layer.input_layernorm, layer.post_attention_layernorm):
        norm.weight.data = (1 + 0.3 * torch.randn(SPEC.hidden_size)).to(dtype)
    layer.fuse()
    h = torch.randn(40, SPEC.hidden_size)
    cos, sin = torch.randn(2, 40, SPEC.head_dim).to(dtype)

    def run() -> tuple[torch.Tensor, ...]:
        with torch.no_grad():
            q, k, v = layer.qkv(h, cos, sin)
            return q, k, v, layer.finish(h, torch.randn(6, 40, 16, generator=_gen(10)).to(dtype))

    fused = run()
    monkeypatch.setenv("ILRE_NATIVE_PASSES", "0")
    plain = run()
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    for got, want in zip(fused, plain):
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got.float(), want.float(), **tolerance)
