"""`--dtype int8`: the rotation is exact, the int8 product is the dequantized product exactly (no saturation),
and the quantized model stays near float32 on the tiny models and on the embedded model's selections."""

from __future__ import annotations

import pytest
import torch

from ilre.compressor.prefill import streaming_prefill
from ilre.compressor.prefill_config import PrefillConfig
from ilre.kernels.rope import keys_as_read
from ilre.models.device import PlacementError, _check_int8, resolve_placement
from ilre.models.int8 import (ACTIVATION_LEVELS, Int8Linear, WEIGHT_LEVELS, hadamard, quantize, quantize_tokens, rotate,
                              rotated_columns)
from ilre.models.loader import load_truncated
from tests.tiny_models import N_LAYERS, random_ids, single_thread, tiny_checkpoint  # noqa: F401

CONFIG = PrefillConfig(sink=2, window=12, chunk=5)


@pytest.mark.parametrize("n", [1, 12, 24, 64, 96, 576, 1536, 896])
def test_hadamard_is_orthonormal_and_flat_where_one_is_built(n):
    h = hadamard(n)
    torch.testing.assert_close(h @ h.T, torch.eye(n, dtype=torch.float64), rtol=0, atol=1e-12)
    if n != 896:  # 896 = 7 * 128: no Hadamard built, a fixed random orthogonal matrix instead
        assert torch.all(h.abs() == h.abs()[0, 0])


def _exact_product(x: torch.Tensor, linear: Int8Linear) -> torch.Tensor:
    """The product of the quantized operands (quantized as the module does), in float64: what the kernel must return."""
    scale, qx = quantize_tokens(x)
    assert (qx.int() - 128).abs().max() <= ACTIVATION_LEVELS
    return ((qx.double() - 128) @ linear.qweight.double().T) * scale.double() * linear.scale.double()


def test_quantize_tokens_scales_by_each_tokens_largest_magnitude_bit_for_bit():
    x = torch.randn(64, 1536, generator=torch.Generator().manual_seed(3)) * torch.linspace(0.01, 40, 64)[:, None]
    x[5] = 0.0  # a token of zeros: the scale's floor
    x[7, 9] = -1000.0  # a token whose largest magnitude is negative
    scale, qx = quantize_tokens(x)
    expected = (x.abs().amax(-1, keepdim=True) / ACTIVATION_LEVELS).clamp_min(1e-12)
    assert torch.equal(scale, expected)
    assert torch.equal(qx, (x / expected).round().add(128).to(torch.uint8)) and qx[7, 9] == 1


def test_int8_linear_is_the_dequantized_product_exactly_without_saturation():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(37, 96, generator=generator)
    x[:, :4] *= 30.0  # outlier channels: u8 values near 0 and 255 next to large weights
    weight = torch.randn(80, 96, generator=generator)
    weight[:, :4] *= 10.0
    linear = Int8Linear(weight)
    assert linear.qweight.abs().max() == WEIGHT_LEVELS
    exact = _exact_product(x, linear)
    torch.testing.assert_close(linear(x).double(), exact, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(linear(x, slice(16, 48)), linear(x)[:, 16:48])  # rows of the product
    torch.testing.assert_close(linear(x.view(37, 1, 96)), linear(x).view(37, 1, 80))  # leading dims kept
    relative = (linear(x) - x @ weight.T).norm() / (x @ weight.T).norm()
    assert relative < 0.05


def test_a_rotated_input_is_the_same_product():
    generator = torch.Generator().manual_seed(1)
    x, weight, block = torch.randn(9, 128, generator=generator), torch.randn(40, 128, generator=generator), hadamard(64)
    plain = (x.double() @ weight.double().T)
    rotated = (x.double().view(-1, 64) @ block).view(9, 128) @ rotated_columns(weight, block).double().T
    torch.testing.assert_close(rotated, plain, rtol=1e-6, atol=1e-6)
    linear = Int8Linear(rotated_columns(weight, block), rotate_input=block)
    assert ((linear(x) - plain.float()).norm() / plain.norm()) < 0.05


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_the_rotated_model_is_the_same_function(kind):
    """Residual stream, value heads and norms rotated in float64: keys and queries at every layer as before."""
    context, query = random_ids(40, seed=3), random_ids(4, seed=4)
    layers = tuple(range(1, N_LAYERS + 1))
    plain = streaming_prefill(load_truncated(tiny_checkpoint(kind), N_LAYERS), context, query, CONFIG, layers)
    turned = streaming_prefill(rotate(load_truncated(tiny_checkpoint(kind), N_LAYERS)), context, query, CONFIG, layers)
    for layer in layers:
        torch.testing.assert_close(keys_as_read(turned.keys[layer]), keys_as_read(plain.keys[layer]), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(turned.queries[layer], plain.queries[layer], rtol=1e-4, atol=1e-4)


class _DequantizedLinear(Int8Linear):
    """The reference: the same quantized operands multiplied in float64 (`_exact_product`)."""

    def forward(self, x, rows=slice(None)):
        flat = x.reshape(-1, x.shape[-1]).float()
        if self.rotate_input is not None:
            flat = (flat.reshape(-1, self.rotate_input.shape[0]) @ self.rotate_input).reshape(flat.shape)
        return _exact_product(flat, self)[:, rows].float().reshape(*x.shape[:-1], -1)


def test_the_quantized_model_is_its_dequantized_arithmetic_and_near_float32():
    # every product of a whole prefill against the float64 product of the same quantized operands, call by call: a
    # second prefill through the reference would quantize inputs that differ in float32's last bits, and a level
    # rounded the other way at one layer moves the next layers' activations by more than any tolerance of the product
    context, query = random_ids(40, seed=5), random_ids(4, seed=6)
    int8 = quantize(load_truncated(tiny_checkpoint("llama"), N_LAYERS))
    calls = []

    def record(module, inputs, out) -> None:
        calls.append((module, inputs[0].clone(), inputs[1] if len(inputs) > 1 else slice(None), out.clone()))

    hooks = [m.register_forward_hook(record) for m in int8.modules() if isinstance(m, Int8Linear)]
    got = streaming_prefill(int8, context, query, CONFIG)
    for hook in hooks:
        hook.remove()
    assert {type(m) for m, *_ in calls} == {Int8Linear} and len({id(m) for m, *_ in calls}) == len(hooks)
    for module, x, rows, out in calls:
        torch.testing.assert_close(out, _DequantizedLinear.forward(module, x, rows), rtol=1e-5, atol=1e-5)
    plain = streaming_prefill(load_truncated(tiny_checkpoint("llama"), N_LAYERS), context, query, CONFIG)
    # the tiny models' weights are made large, so that errors grow through 4 layers; the embedded model's
    # selections are what docs/benchmarks.md measures
    got_keys, plain_keys = keys_as_read(got.keys[N_LAYERS]), keys_as_read(plain.keys[N_LAYERS])
    assert ((got_keys - plain_keys).norm() / plain_keys.norm()) < 0.2


def test_a_model_with_biases_is_refused_by_name():
    with pytest.raises(ValueError, match="dtype: int8 needs a model without linear biases"):
        quantize(load_truncated(tiny_checkpoint("qwen2"), N_LAYERS))


def test_placement_int8_is_float32_with_int8_linears_on_cpus_only():
    placement = resolve_placement("cpu", "int8")
    assert (placement.dtype, placement.int8, placement.dtype_name) == (torch.float32, True, "int8")
    assert resolve_placement("cpu", "float32").dtype_name == "float32"
    with pytest.raises(PlacementError, match="^dtype: int8 runs on CPUs only"):
        _check_int8(torch.device("cuda", 0))


def test_the_embedded_model_in_int8_keeps_the_needle_and_most_of_float32s_selection(engine):
    """`--dtype int8` on the embedded model, plain ILRe at the fast layer (the speed row's path) over a 3K-token
    passkey: the needle kept, most of float32's selection kept (docs/benchmarks.md measures 32K)."""
    from ilre.engine.engine import Engine, EngineConfig
    from ilre.contract.messages import CompressRequest
    from ilre.evaluation.tasks.passkey import make_passkey_sample

    int8 = Engine(EngineConfig(dtype="int8", doc_cache_mb=0, layer="fast"))  # GPTQ rounds layers 2-7 only
    assert int8.placement.dtype_name == "int8" and int8.info().dtype == "int8"
    sample = make_passkey_sample(engine.tokenizer, 3000, 0.5, digits=6, seed=5)
    request = CompressRequest(context_ids=sample.context_ids, query_ids=sample.query_ids, budget=256,
                              strategy="ilre", layer="fast")
    want, got = set(engine.compress(request).kept_indices), set(int8.compress(request).kept_indices)
    assert all(i in got for i in range(*sample.needle))
    assert len(got & want) / len(want) >= 0.85
