"""What the compressor needs to know about a checkpoint, read from its config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3")  # the hand-tuned decoder (models/llama.py): the fast path
FULL, SLIDING, LINEAR, CHUNKED = "full_attention", "sliding_attention", "linear_attention", "chunked_attention"


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
    path: str = "fast"  # "fast": models/llama.py; "transformers": the family's own layers (models/transformers_lm.py)
    layer_kinds: tuple[str, ...] = ()  # per layer: FULL, SLIDING, LINEAR, CHUNKED (empty: every layer FULL)
    v_head_dim: int = 0  # a value head's width where it differs from a key head's (MLA), else 0

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.num_heads // self.num_kv_heads

    @property
    def value_dim(self) -> int:
        """The width of a value head (head_dim but for MLA's)."""
        return self.v_head_dim or self.head_dim

    def kind(self, layer: int) -> str:
        """The attention of 1-based `layer`: FULL, SLIDING, LINEAR or CHUNKED."""
        return self.layer_kinds[layer - 1] if self.layer_kinds else FULL

    @property
    def global_layers(self) -> tuple[int, ...]:
        """The 1-based layers with global attention: where l_R may be (a sliding, chunked or linear layer
        cannot see the whole context)."""
        return tuple(l for l in range(1, self.num_layers + 1) if self.kind(l) == FULL)


# the config.json keys fast_spec and a default RoPE read; a file holding them all is read as it is
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


def fast_spec(config) -> ModelSpec:
    """ModelSpec of a checkpoint the hand-tuned Llama decoder computes (ValueError for another architecture; the
    choice of path is models/loader.spec_from_config's)."""
    model_type = config.model_type
    if model_type not in SUPPORTED_TYPES:
        raise ValueError(
            f"model: architecture {model_type!r} has no fast path (it has: {', '.join(SUPPORTED_TYPES)})"
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


def fast_path_applies(config) -> bool:
    """Whether the hand-tuned Llama decoder computes this checkpoint: one of SUPPORTED_TYPES, every layer full
    attention, a RoPE type transformers' initialisers give (default, llama3, yarn, ...)."""
    if config.model_type not in SUPPORTED_TYPES:
        return False
    kinds = getattr(config, "layer_types", None) or ()
    if any(kind != FULL for kind in kinds):
        return False
    return not (config.model_type == "qwen2" and getattr(config, "use_sliding_window", False))


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
