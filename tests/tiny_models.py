"""Tiny random transformers checkpoints for CPU tests (importable helpers, not fixtures).

Every kind is a 4-layer decoder with hidden 64, 4 query heads and 2 KV heads (GQA group 2), vocab
128, saved with save_pretrained (safetensors) into a temporary folder that lives for the test
session. Weights are drawn from a seeded generator with a large scale (std 0.2, norms 1 +- 0.2,
non-zero biases) so that attention is far from uniform and a wrong norm, bias or RoPE shows up.

Kinds:
  llama       default RoPE (theta 10000), head_dim 16
  llama3      Llama-3 frequency-scaled RoPE (rope_type "llama3"), theta 500000
  qwen2       q/k/v biases, theta 1e6
  qwen2_yarn  YaRN RoPE: non-unit attention scaling of cos/sin
  qwen3       q/k RMS norms, explicit head_dim 24 (!= hidden / heads)
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

KINDS = ("llama", "llama3", "qwen2", "qwen2_yarn", "qwen3")
N_LAYERS = 4
VOCAB = 128

_COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=N_LAYERS,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=VOCAB,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    initializer_range=0.2,
    tie_word_embeddings=False,
)


def tiny_config(kind: str):
    """The transformers config of one tiny kind (see module docstring)."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    if kind == "llama":
        return LlamaConfig(**_COMMON, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if kind == "llama3":
        rope = {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
        return LlamaConfig(**_COMMON, rope_parameters=rope)
    if kind == "qwen2":
        return Qwen2Config(**_COMMON, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    if kind == "qwen2_yarn":
        rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}
        return Qwen2Config(**_COMMON, rope_parameters=rope)
    if kind == "qwen3":
        return Qwen3Config(**_COMMON, head_dim=24, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    raise ValueError(f"unknown tiny model kind {kind!r}")


def build_tiny_model(kind: str, seed: int = 0):
    """A float32 transformers CausalLM of the given kind with seeded, deliberately large weights."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(kind), dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            if "norm" in name:
                param.copy_(1.0 + 0.2 * noise)
            elif "embed_tokens" in name:
                param.copy_(noise)
            else:  # linear weights and biases
                param.copy_(0.2 * noise)
    return model.eval()


_ROOT: Path | None = None
_CACHE: dict[tuple[str, int], Path] = {}


def _root() -> Path:
    global _ROOT
    if _ROOT is None:
        _ROOT = Path(tempfile.mkdtemp(prefix="ilre-tiny-"))
        atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)
    return _ROOT


def tiny_checkpoint(kind: str, seed: int = 0) -> Path:
    """Folder with config.json + model.safetensors of the tiny kind; built once per session."""
    key = (kind, seed)
    if key not in _CACHE:
        folder = _root() / f"{kind}-{seed}"
        build_tiny_model(kind, seed).save_pretrained(str(folder), safe_serialization=True)
        _CACHE[key] = folder
    return _CACHE[key]


def copy_checkpoint(kind: str, target: Path, seed: int = 0) -> Path:
    """A private copy of a tiny checkpoint (for tests that corrupt it)."""
    shutil.copytree(tiny_checkpoint(kind, seed), target)
    return target


def random_ids(n: int, seed: int) -> torch.Tensor:
    """(n,) int64 token ids in [0, VOCAB), reproducible."""
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """Run a test module's tiny tensor ops on one thread (restored afterwards).

    The ops here are microseconds long; with 2 OpenMP threads on a busy 2-core machine each op can
    wait milliseconds for the second thread (measured: linear 8x64x64 took 16 ms vs 9 us).
    Import this into a test module to make it autouse there.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
