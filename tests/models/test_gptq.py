"""GPTQ for `--dtype int8` (models/gptq.py): the blocked rounding is the paper's literal loop, it moves the product on
its calibration inputs less than rounding to nearest, and `quantize` with a calibration keeps its rounding on disk."""

from __future__ import annotations

import torch
from torch import nn

from ilre.compressor.prefill import streaming_prefill
from ilre.compressor.prefill_config import PrefillConfig
from ilre.kernels.rope import keys_as_read
from ilre.models.gptq import BLOCK, gptq, gptq_reference, input_hessians
from ilre.models.int8 import Calibration, Int8Linear, WEIGHT_LEVELS, quantize
from ilre.models.loader import load_truncated
from tests.models.test_int8 import CONFIG
from tests.tiny_models import N_LAYERS, random_ids, tiny_checkpoint


def _inputs(rows: int, width: int, seed: int) -> torch.Tensor:
    """(rows, width) inputs with correlated columns and a few outlier channels, as a model's activations have."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=generator, dtype=torch.float64)
    x = x @ (torch.eye(width, dtype=torch.float64) + 0.3 * torch.randn(width, width, generator=generator, dtype=torch.float64))
    x[:, :3] *= 20.0
    return x


def test_blocked_gptq_is_the_literal_loop():
    width = BLOCK + 72  # a whole block and a partial one
    x = _inputs(600, width, seed=0)
    x[:, 7] = 0.0  # an input never seen: its weights go to zero
    weight = torch.randn(24, width, generator=torch.Generator().manual_seed(1))
    qweight, scale = gptq(weight, x.T @ x, WEIGHT_LEVELS)
    want_q, want_scale = gptq_reference(weight, x.T @ x, WEIGHT_LEVELS)
    assert qweight.dtype == torch.int8 and qweight.abs().max() <= WEIGHT_LEVELS
    assert torch.equal(scale, want_scale)
    assert torch.equal(qweight, want_q)
    assert torch.all(qweight[:, 7] == 0)


def test_gptq_moves_the_calibration_product_less_than_rounding_to_nearest():
    every = _inputs(1200, 96, seed=2)
    x, held_out = every[:800], every[800:]  # held out: the same distribution, rows it did not see
    weight = torch.randn(64, 96, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    nearest = Int8Linear(weight.float())
    rounded = gptq(weight, x.T @ x, WEIGHT_LEVELS)

    def error(qweight: torch.Tensor, scale: torch.Tensor, inputs: torch.Tensor) -> float:
        return float((inputs @ (qweight.double() * scale.double()[:, None] - weight).T).norm() / (inputs @ weight.T).norm())

    assert error(*rounded, x) < 0.6 * error(nearest.qweight, nearest.scale, x)
    assert error(*rounded, held_out) < 0.8 * error(nearest.qweight, nearest.scale, held_out)


def test_input_hessians_are_the_inputs_each_matrix_reads():
    model = load_truncated(tiny_checkpoint("llama"), N_LAYERS)
    ids = random_ids(30, seed=8)
    hessians = input_hessians(model, [ids], range(2, N_LAYERS))
    assert sorted(hessians) == sorted((i, m) for i in range(2, N_LAYERS) for m in ("qkv", "o", "gate_up", "down"))
    seen: dict[str, torch.Tensor] = {}  # layer 2's inputs, caught from the float32 model's own modules
    layer = model.layer(2)

    def catch(name: str, output: bool):
        def hook(module, inputs, out) -> None:
            seen.setdefault(name, out if output else inputs[0])
        return hook

    layer.input_layernorm.register_forward_hook(catch("qkv", True))
    layer.self_attn.o_proj.register_forward_hook(catch("o", False))
    layer.mlp.gate_up_proj.register_forward_hook(catch("gate_up", False))  # the norm may run fused with the sum
    layer.mlp.down_proj.register_forward_hook(catch("down", False))
    streaming_prefill(model, ids, random_ids(2, seed=9), PrefillConfig(sink=2, window=64, chunk=64))  # one chunk: dense
    assert sorted(seen) == ["down", "gate_up", "o", "qkv"]
    for name, x in seen.items():
        x = x.reshape(-1, x.shape[-1])[:30].double()
        torch.testing.assert_close(hessians[2, name], x.T @ x, rtol=1e-4, atol=1e-3)


def test_quantize_with_a_calibration_rounds_each_layer_once_keeps_scored_projections_and_stays_near_float32(tmp_path):
    sequences = (random_ids(48, seed=10), random_ids(48, seed=11))
    at_once = quantize(load_truncated(tiny_checkpoint("llama"), N_LAYERS), Calibration(sequences, tmp_path / "a", "tiny"))
    calibration = Calibration(sequences, tmp_path / "b", "tiny")
    shorter = quantize(load_truncated(tiny_checkpoint("llama"), N_LAYERS - 1), calibration)  # rounds layer 2
    (stored,) = (tmp_path / "b").iterdir()
    assert stored.name.startswith("tiny-")
    first = quantize(load_truncated(tiny_checkpoint("llama"), N_LAYERS), calibration, float_qkv=frozenset({2}))  # adds 3
    assert list((tmp_path / "b").iterdir()) == [stored]
    assert isinstance(first.layer(2).self_attn.qkv_proj, nn.Linear)  # scored: float32
    assert isinstance(first.layer(3).self_attn.qkv_proj, Int8Linear)
    assert torch.equal(shorter.layer(2).mlp.down_proj.qweight, at_once.layer(2).mlp.down_proj.qweight)
    for index in range(2, N_LAYERS):  # the same rounding, layer by layer or at once
        assert torch.equal(first.layer(index).mlp.gate_up_proj.qweight, at_once.layer(index).mlp.gate_up_proj.qweight)
    nearest = quantize(load_truncated(tiny_checkpoint("llama"), N_LAYERS))
    assert not torch.equal(nearest.layer(3).mlp.gate_up_proj.qweight, first.layer(3).mlp.gate_up_proj.qweight)
    context, query = random_ids(40, seed=5), random_ids(4, seed=6)
    plain = keys_as_read(streaming_prefill(load_truncated(tiny_checkpoint("llama"), N_LAYERS), context, query, CONFIG).keys[N_LAYERS])
    got = keys_as_read(streaming_prefill(first, context, query, CONFIG).keys[N_LAYERS])
    assert ((got - plain).norm() / plain.norm()) < 0.2


def test_a_cache_folder_that_cannot_be_written_costs_the_rounding_not_the_start(tmp_path, caplog):
    (tmp_path / "blocker").write_text("a file where the cache folder would be")
    calibration = Calibration((random_ids(48, seed=10),), tmp_path / "blocker" / "int8", "tiny")
    model = quantize(load_truncated(tiny_checkpoint("llama"), N_LAYERS), calibration)
    assert isinstance(model.layer(2).mlp.down_proj, Int8Linear)
    assert "could not keep the rounding" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker"]
