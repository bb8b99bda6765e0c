"""bfloat16 weights packed once for oneDNN (models/packed_linear.py): the products are the plain layers' products,
the loader packs exactly where bfloat16 is native, and a packed model prefills as the plain one does."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ilre.compressor.prefill import streaming_prefill
from ilre.compressor.prefill_config import PrefillConfig
from ilre.models.loader import load_truncated
from ilre.models.packed_linear import PACKED, PackedLinear, packing_applies, unpack_linears
from tests.tiny_models import N_LAYERS, random_ids, single_thread, tiny_checkpoint  # noqa: F401

CPU = torch.device("cpu")
native = pytest.mark.skipif(not packing_applies(torch.bfloat16, CPU),
                            reason="this CPU's oneDNN has no native bfloat16: nothing is packed")


def _linear(n: int, k: int, bias: bool, seed: int) -> nn.Linear:
    gen = torch.Generator().manual_seed(seed)
    linear = nn.Linear(k, n, bias=bias, dtype=torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(n, k, generator=gen))
        if bias:
            linear.bias.copy_(torch.randn(n, generator=gen))
    return linear.requires_grad_(False)


def _within_rounding(y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """y is the float64 product rounded once to bfloat16 (float32 accumulation's error well below that rounding)."""
    ref = x.double() @ weight.double().T + (0 if bias is None else bias.double())
    torch.testing.assert_close(y.double(), ref, rtol=2 ** -8, atol=1e-2)


@native
@pytest.mark.parametrize("rows_m", [1, 34, 1024])
@pytest.mark.parametrize("bias", [False, True])
def test_a_packed_product_is_the_plain_product(rows_m, bias):
    linear = _linear(960, 576, bias, seed=rows_m)
    packed = PackedLinear(linear)
    x = torch.randn(rows_m, 576, generator=torch.Generator().manual_seed(1)).bfloat16()
    y, plain = packed(x), F.linear(x, linear.weight, linear.bias)
    assert y.dtype == torch.bfloat16 and y.shape == (rows_m, 960)
    _within_rounding(y, x, linear.weight, linear.bias)
    assert (y == plain).float().mean() >= 0.99  # the same kernels on the same operands: rare roundings apart at most


@native
def test_rows_of_a_packed_product_and_batched_inputs():
    linear = _linear(960, 576, True, seed=5)
    packed = PackedLinear(linear)
    x = torch.randn(2, 7, 576, generator=torch.Generator().manual_seed(2)).bfloat16()
    full = packed(x)
    assert full.shape == (2, 7, 960)
    for rows in (slice(576, 768), slice(0, 768), slice(768, None)):
        part = packed(x, rows)
        assert part.shape == (2, 7, len(range(960)[rows]))
        _within_rounding(part, x, linear.weight[rows], linear.bias[rows])
        assert (part == full[..., rows]).float().mean() >= 0.99
    assert set(packed._packed) == {(0, 960), (576, 768), (0, 768), (768, 960)}  # each slice packed once


@native
def test_the_packed_weight_unpacks_to_the_loaded_one():
    linear = _linear(1536, 576, False, seed=7)
    packed = PackedLinear(linear)
    assert torch.equal(packed.weight, linear.weight)
    assert all(held.is_mkldnn for held in packed._packed.values())  # only oneDNN's layout is kept
    assert not any(isinstance(t, torch.Tensor) and t.layout == torch.strided and t.shape == linear.weight.shape
                   for t in vars(packed).values())  # the plain weight is not held beside the packed one


def test_packing_applies_to_bfloat16_on_cpus_only():
    assert not packing_applies(torch.float32, CPU)
    assert not packing_applies(torch.float16, CPU)
    assert not packing_applies(torch.bfloat16, torch.device("meta"))
    assert packing_applies(torch.bfloat16, CPU) == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _layers_packed(model) -> list[bool]:
    out = []
    for layer in model.layers:
        for owner in (layer.self_attn, getattr(layer, "mlp", None)):
            out += [isinstance(getattr(owner, name), PackedLinear) for name in PACKED if hasattr(owner, name)]
    return out


def test_the_loader_packs_bfloat16_where_native_and_float32_never():
    folder = tiny_checkpoint("llama")
    assert not any(_layers_packed(load_truncated(folder, N_LAYERS, torch.float32)))
    packed = _layers_packed(load_truncated(folder, N_LAYERS, torch.bfloat16))
    assert len(packed) == 4 * (N_LAYERS - 1) + 1  # the retrieval layer has its q/k/v only
    assert all(packed) if packing_applies(torch.bfloat16, CPU) else not any(packed)


@native
def test_a_packed_model_prefills_as_the_plain_one():
    folder = tiny_checkpoint("llama")
    config = PrefillConfig(sink=2, window=12, chunk=5)
    ids, query = random_ids(37, seed=3), random_ids(4, seed=4)
    plain = unpack_linears(load_truncated(folder, N_LAYERS, torch.bfloat16))
    packed = load_truncated(folder, N_LAYERS, torch.bfloat16)
    assert all(_layers_packed(packed)) and not any(_layers_packed(plain))
    with torch.inference_mode():
        a = streaming_prefill(plain, ids, query, config)
        b = streaming_prefill(packed, ids, query, config)
    for layer in a.keys:
        torch.testing.assert_close(b.keys[layer].float(), a.keys[layer].float(), rtol=2 ** -6, atol=2 ** -6)
        torch.testing.assert_close(b.queries[layer].float(), a.queries[layer].float(), rtol=2 ** -6, atol=2 ** -6)


@native
def test_packed_weights_keep_the_tokens_plain_weights_keep_on_the_evaluations_tasks():
    """The embedded model in bfloat16, packed as loaded and then unpacked, on passkey tasks of the evaluation (one
    needle; a needle among distractors) at 4K: the same kept indices by the default and by plain ILRe."""
    from ilre.engine.engine import Engine, EngineConfig
    from ilre.contract.messages import CompressRequest
    from ilre.evaluation.tasks.passkey import make_passkey_sample

    engine = Engine(EngineConfig(dtype="bfloat16", doc_cache_mb=0))
    samples = [make_passkey_sample(engine.tokenizer, 4096, depth, seed=seed, distractors=distractors)
               for depth, seed, distractors in ((0.3, 1, 0), (0.7, 2, 4))]
    requests = [CompressRequest(context_ids=s.context_ids, query_ids=s.query_ids, budget=256, **extra)
                for s in samples for extra in ({}, {"strategy": "ilre"})]
    packed = [engine.compress(r).kept_indices for r in requests]
    models = list(engine._models.values())  # every model the requests ran on
    assert models and all(any(isinstance(m, PackedLinear) for m in model.modules()) for model in models)
    for model in models:
        unpack_linears(model)
    plain = [engine.compress(r).kept_indices for r in requests]
    assert packed == plain
