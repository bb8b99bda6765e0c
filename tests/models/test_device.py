"""--device / --dtype parsing and plumbing, on the CPU (CI has no GPU and no NPU)."""

from __future__ import annotations

import builtins
import importlib.util

import pytest
import torch

from ilre.compressor.prefill import streaming_prefill
from ilre.compressor.prefill_config import PrefillConfig
from ilre.kernels.rope import keys_as_read
from ilre.models import device
from ilre.models.device import PlacementError, cpu_has_native_bfloat16, resolve_device, resolve_dtype, resolve_placement
from ilre.models.int8 import int8_available
from ilre.models.loader import load_truncated
from tests.reference import dense_prefill
from tests.tiny_models import N_LAYERS, random_ids, single_thread, tiny_checkpoint  # noqa: F401


def test_cpu_and_auto_without_accelerators():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("CPU:0") == torch.device("cpu")
    if not torch.cuda.is_available() and importlib.util.find_spec("torch_npu") is None:
        assert resolve_device("auto") == torch.device("cpu")


@pytest.mark.parametrize("name, message", [
    ("gpu", "device: 'gpu' is not one of auto, cpu, cuda"),
    ("cuda:x", "is not one of"),
    ("cpu:1", "there is one CPU device"),
    ("auto:0", "'auto' takes no index"),
])
def test_bad_device_names_are_named(name, message):
    with pytest.raises(PlacementError, match=message):
        resolve_device(name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(PlacementError, match=r"device: 'cuda:1' asked for, but (torch was built without CUDA|no CUDA device)"):
        resolve_device("cuda:1")


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="torch_npu is installed")
def test_npu_without_torch_npu_is_a_clear_error():
    with pytest.raises(PlacementError, match="device: npu needs the torch_npu package"):
        resolve_device("npu:0")


def test_torch_npu_is_imported_only_when_an_npu_is_asked_for(monkeypatch):
    imported: list[str] = []
    real_import = builtins.__import__

    def spy(name, *args, **kwargs):
        imported.append(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", spy)
    monkeypatch.setattr(importlib, "import_module", lambda name: spy(name))
    resolve_placement("cpu", "float32")
    resolve_placement("cpu", "auto")
    assert "torch_npu" not in imported
    with pytest.raises(PlacementError):
        resolve_device("npu")
    assert "torch_npu" in imported


def test_dtypes():
    cpu = torch.device("cpu")
    assert resolve_dtype("float32", cpu) == torch.float32
    assert resolve_dtype("BFloat16", cpu) == torch.bfloat16
    assert resolve_dtype("float16", cpu) == torch.float16
    assert resolve_dtype("auto", cpu) == (torch.bfloat16 if cpu_has_native_bfloat16() else torch.float32)
    with pytest.raises(PlacementError, match="dtype: 'int4' is not one of auto, float32, bfloat16, float16, int8"):
        resolve_dtype("int4", cpu)
    with pytest.raises(PlacementError, match="dtype: int8 is a placement"):  # int8 is resolve_placement's
        resolve_dtype("int8", cpu)


def test_native_bfloat16_is_read_from_cpu_flags(tmp_path):
    zen4 = tmp_path / "zen4"
    zen4.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n")
    old = tmp_path / "old"
    old.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n")
    assert cpu_has_native_bfloat16(zen4) and cpu_has_native_bfloat16(arm)
    assert not cpu_has_native_bfloat16(old) and not cpu_has_native_bfloat16(tmp_path / "missing")


def test_auto_runs_int8_on_x86_cpus_without_native_bfloat16(tmp_path, monkeypatch):
    epyc = tmp_path / "epyc"
    epyc.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n")
    zen4 = tmp_path / "zen4"
    zen4.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n")
    cpu = torch.device("cpu")
    monkeypatch.setattr(device.platform, "machine", lambda: "x86_64")
    assert device.auto_picks_int8(cpu, epyc) == int8_available()
    assert not device.auto_picks_int8(cpu, zen4)  # native bfloat16 is faster and keeps more of float32's
    assert not device.auto_picks_int8(torch.device("cuda", 0), epyc)
    monkeypatch.setattr(device.platform, "machine", lambda: "aarch64")
    assert not device.auto_picks_int8(cpu, epyc)  # int8's exact sums are x86's (models/int8.py)
    monkeypatch.setattr(device.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(device, "cpu_has_native_bfloat16", lambda cpuinfo=None: False)
    auto = resolve_placement("cpu", "auto")
    assert (auto.int8, auto.dtype, auto.dtype_name) == (int8_available(), torch.float32,
                                                        "int8" if int8_available() else "float32")
    assert resolve_placement("cpu", "float32") == device.Placement(cpu, torch.float32)  # named dtypes stay what they say
    monkeypatch.setattr(device, "cpu_has_native_bfloat16", lambda cpuinfo=None: True)
    assert resolve_placement("cpu", None) == device.Placement(cpu, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weights_are_loaded_in_the_dtype_and_fused(dtype):
    model = load_truncated(tiny_checkpoint("qwen2"), N_LAYERS, dtype, "cpu")
    assert model.dtype == dtype and model.device == torch.device("cpu")
    assert all(p.dtype == dtype for p in model.parameters())
    assert model.inv_freq.dtype == torch.float32  # RoPE angles stay float32
    assert hasattr(model.layer(1).self_attn, "qkv_proj") and not hasattr(model.layer(1).self_attn, "q_proj")
    assert hasattr(model.layer(1).mlp, "gate_up_proj")


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("config", [PrefillConfig(sink=2, window=5, chunk=7), PrefillConfig(sink=2, window=5, chunk=7, dca=True)])
def test_bfloat16_streaming_prefill_is_close_to_the_float32_dense_reference(kind, config):
    # bfloat16 rounds every matmul input: the keys and queries at l_R stay within a few percent
    # of the float32 dense computation, and the scores keep the same top tokens
    context, query = random_ids(51, seed=3), random_ids(4, seed=4)
    reference = load_truncated(tiny_checkpoint(kind), N_LAYERS)
    ref_keys, ref_queries = dense_prefill(reference, context, query, config)
    state = streaming_prefill(load_truncated(tiny_checkpoint(kind), N_LAYERS, torch.bfloat16), context, query, config)
    keys, queries = keys_as_read(state.keys[N_LAYERS]), state.queries[N_LAYERS]
    assert keys.dtype == torch.bfloat16
    scale = ref_keys.abs().max()
    torch.testing.assert_close(keys.float(), ref_keys, atol=0.05 * scale, rtol=0.05)
    torch.testing.assert_close(queries.float(), ref_queries, atol=0.05 * ref_queries.abs().max(), rtol=0.05)
    relative = (keys.float() - ref_keys).norm() / ref_keys.norm()
    assert relative < 0.04  # bfloat16 keeps 8 bits: ~0.4% per rounding, a few roundings per layer
