"""What the compressor reads of a checkpoint that runs through its family's own transformers layers
(models/transformers_lm.py): shapes, each layer's kind of attention, and the families refused with their reason."""

from __future__ import annotations

from .spec import CHUNKED, FULL, LINEAR, SLIDING, ModelSpec

# transformers' layer_types names -> the kind of streaming each layer gets
_KINDS = {"full_attention": FULL, "attention": FULL, "global_attention": FULL, "sliding_attention": SLIDING,
          "sliding_window": SLIDING, "local_attention": SLIDING, "chunked_attention": CHUNKED}

# families whose attention is itself a learned sparse selection: ILRe's scores at l_R would not be what the model
# attends to (an indexer picks the keys each query reads)
SPARSE_SELECTION = ("deepseek_v32", "deepseek_v4", "glm_moe_dsa", "glm5_next", "minimax_m3_vl", "hy_v4", "dots3_note")


def _get(config, name: str, default=None):
    """A config attribute, or `default` where it is missing or varies per layer (transformers refuses a global read
    of a per-layer attribute)."""
    try:
        return getattr(config, name, default)
    except Exception:  # AmbiguousGlobalPerLayerAttributeError
        return default


def layer_kinds(config) -> tuple[str, ...]:
    """Each layer's attention, from the config's `layer_types` (FULL where it names none): FULL, SLIDING,
    CHUNKED, or LINEAR for any layer that is not attention (linear attention, state-space mixers)."""
    n = config.num_hidden_layers
    types = list(getattr(config, "layer_types", None) or ())[:n]
    if not types:
        return (FULL,) * n
    return tuple(_KINDS.get(str(t), LINEAR) for t in types)


def refusal(config) -> str | None:
    """Why this family cannot be compressed through its own layers, or None."""
    model_type = config.model_type
    if model_type in SPARSE_SELECTION or getattr(config, "index_topk", None) or getattr(config, "indexer_n_heads",
                                                                                       None):
        return (f"architecture {model_type!r}: its attention is a learned sparse selection (an indexer picks the "
                "keys each query reads), so attention scores at l_R are not what the model reads")
    if getattr(config, "attn_logit_softcapping", None):
        return f"architecture {model_type!r}: attention logit soft-capping is not streamed"
    if getattr(config, "is_encoder_decoder", False):
        return f"architecture {model_type!r}: an encoder-decoder, not a decoder-only language model"
    if not any(kind == FULL for kind in layer_kinds(config)):
        return f"architecture {model_type!r}: no layer with global attention to score at"
    return None


def transformers_spec(config) -> ModelSpec:
    """ModelSpec of a family run through its own layers. Head counts and widths are the config's (MLA: a key
    head is qk_nope + qk_rope wide, a value head v_head_dim); models/transformers_lm.py checks them against what
    the layers hand their attention. Raises ValueError naming the architecture and why where it is refused."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    why = refusal(text)
    if why is not None:
        raise ValueError(f"model: {why}")
    heads = text.num_attention_heads
    kv_heads = _get(text, "num_key_value_heads", None) or heads
    head_dim = _get(text, "global_head_dim", None) or _get(text, "head_dim", None) or text.hidden_size // heads
    v_head_dim = 0
    if _get(text, "kv_lora_rank", None):  # MLA: keys and values per head from a latent
        head_dim = text.qk_nope_head_dim + text.qk_rope_head_dim
        v_head_dim, kv_heads = text.v_head_dim, heads
    return ModelSpec(
        model_type=text.model_type, vocab_size=text.vocab_size, hidden_size=text.hidden_size,
        intermediate_size=_get(text, "intermediate_size", 0) or 0, num_layers=text.num_hidden_layers,
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        rms_norm_eps=float(_get(text, "rms_norm_eps", 1e-6) or 1e-6),
        native_context=int(_get(text, "max_position_embeddings", 0) or 0) or 4096,
        qkv_bias=False, o_bias=False, mlp_bias=False, qk_norm=False, path="transformers",
        layer_kinds=layer_kinds(text), v_head_dim=v_head_dim if v_head_dim != head_dim else 0,
    )
