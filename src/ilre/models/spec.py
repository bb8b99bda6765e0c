"""What the compressor needs to know about a checkpoint, read from its config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class ModelSpec:
    """Shapes and options of a Llama-family decoder."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    native_context: int  # max_position_embeddings: the window the model was trained for
    qkv_bias: bool  # Qwen2 has biases on q/k/v
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool  # Qwen3 normalises q and k per head before RoPE

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.num_heads // self.num_kv_heads


# the config.json keys spec_from_config and a default RoPE read; a file holding them all is read as it is
_PLAIN_KEYS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "rms_norm_eps", "max_position_embeddings")


def load_hf_config(checkpoint: Path):
    """The config of a checkpoint folder (parsing only; builds no model): config.json's own values where it
    states every one the compressor reads and a default RoPE, else transformers' config object (its defaults and
    RoPE types). The first skips importing transformers' model configs (~2.5 s of a process start)."""
    plain = _plain_config(Path(checkpoint) / "config.json")
    if plain is not None:
        return plain
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(checkpoint))


def _plain_config(path: Path) -> SimpleNamespace | None:
    """config.json as attributes, or None where transformers must read it (a key missing, a RoPE other than
    the default)."""
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if values.get("rope_parameters") is not None:  # transformers 5
        rope = values["rope_parameters"]
        default_rope = rope.get("rope_type", "default") == "default" and "rope_theta" in rope
    else:  # transformers 4: rope_theta, and rope_scaling for any other type
        default_rope = values.get("rope_scaling") is None and "rope_theta" in values
    if not default_rope or any(key not in values for key in _PLAIN_KEYS):
        return None
    return SimpleNamespace(**values)


def spec_from_config(config) -> ModelSpec:
    """ModelSpec from a transformers config; raises ValueError for an unsupported architecture."""
    model_type = config.model_type
    if model_type not in SUPPORTED_TYPES:
        raise ValueError(
            f"model: architecture {model_type!r} is not supported (supported: {', '.join(SUPPORTED_TYPES)})"
        )
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    attention_bias = bool(getattr(config, "attention_bias", False))
    return ModelSpec(
        model_type=model_type,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        head_dim=head_dim,
        rms_norm_eps=config.rms_norm_eps,
        native_context=config.max_position_embeddings,
        qkv_bias=True if model_type == "qwen2" else attention_bias,
        o_bias=False if model_type == "qwen2" else attention_bias,
        mlp_bias=bool(getattr(config, "mlp_bias", False)),
        qk_norm=model_type == "qwen3",
    )


def rope_inv_freq(config) -> tuple[torch.Tensor, float]:
    """(inv_freq (head_dim/2,), attention_scaling) for the config's RoPE type (default, llama3, yarn...).

    Non-default types are computed by transformers' own initialisers so they stay in step with it.
    "dynamic" NTK is used at its base frequencies (no per-length update).
    """
    params = getattr(config, "rope_parameters", None)
    if params is None:  # transformers 4.x
        scaling = getattr(config, "rope_scaling", None) or {}
        params = {"rope_type": scaling.get("rope_type", scaling.get("type", "default")),
                  "rope_theta": config.rope_theta}
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        return inv_freq, 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, None)
    return inv_freq.float(), float(scaling)
