"""Tiny random checkpoints of transformers' decoder families, made from each family's own config class (importable
helpers, not fixtures): 6 layers, hidden 64, layer 4 a global-attention layer (the tests' l_R) with layers above
it, windows small enough (8 tokens) that sliding and chunked layers matter on a 60-token input; a byte-level
tokenizer saved beside the weights."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import torch

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3_text", "gemma4_text", "gpt_oss", "qwen3_moe",
            "qwen3_next", "qwen3_5_text", "deepseek_v3", "glm4_moe", "minimax_m2", "llama4_text", "mixtral")
L_R = 4
N_LAYERS = 6
VOCAB = 260  # 256 bytes and 4 specials
WINDOW = 8

_COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=N_LAYERS, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, max_position_embeddings=512,
               pad_token_id=256, bos_token_id=257, eos_token_id=258, tie_word_embeddings=False)
_MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32)
_HYBRID = ["linear_attention"] * 3 + ["full_attention", "linear_attention", "full_attention"]
_SLIDING = ["sliding_attention"] * 3 + ["full_attention", "sliding_attention", "full_attention"]
_OVERRIDES = {
    "mistral": dict(sliding_window=None),
    "gemma3_text": dict(layer_types=_SLIDING, sliding_window=WINDOW, query_pre_attn_scalar=24),
    "gemma4_text": dict(layer_types=_SLIDING, sliding_window=WINDOW, global_head_dim=32, num_global_key_value_heads=2,
                        vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=8),
    "gpt_oss": dict(layer_types=["sliding_attention", "full_attention"] * 3, sliding_window=WINDOW,
                    num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": dict(num_experts=4, **_MOE),
    "qwen3_next": dict(layer_types=_HYBRID, num_experts=4, shared_expert_intermediate_size=32,
                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                       linear_value_head_dim=16, **_MOE),
    "qwen3_5_text": dict(layer_types=_HYBRID, linear_num_key_heads=2, linear_num_value_heads=4,
                         linear_key_head_dim=16, linear_value_head_dim=16),
    "deepseek_v3": dict(head_dim=8, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=48, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
                        n_routed_experts=4, n_group=1, topk_group=1, first_k_dense_replace=1, **_MOE),
    "glm4_moe": dict(n_routed_experts=4, n_group=1, topk_group=1, first_k_dense_replace=1, **_MOE),
    "minimax_m2": dict(num_local_experts=4, num_experts_per_tok=2, rotary_dim=8),
    "llama4_text": dict(layer_types=["chunked_attention"] * 3 + ["full_attention", "chunked_attention",
                                                                  "full_attention"],
                        attention_chunk_size=WINDOW, num_local_experts=4, num_experts_per_tok=1,
                        intermediate_size_mlp=96, no_rope_layers=[1, 1, 1, 0, 1, 0]),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
}


def family_config(family: str):
    """The tiny config of a family (see module docstring)."""
    from transformers import AutoConfig

    return AutoConfig.for_model(family, **{**_COMMON, **_OVERRIDES.get(family, {})})


def build_family_model(family: str, seed: int = 0):
    """A float32 CausalLM of the family with seeded, deliberately large weights (norm weights 1 +- 0.2, the rest
    0.2 * N(0, 1), embeddings N(0, 1)), so that a wrong norm, scaling or rotation shows."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(family), dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not param.is_floating_point():
                continue
            noise = torch.randn(param.shape, generator=gen)
            if "norm" in name:
                param.copy_(1.0 + 0.2 * noise)
            elif "embed_tokens" in name:
                param.copy_(noise)
            elif "A_log" in name or "dt_bias" in name:
                param.copy_(0.5 * noise)
            else:
                param.copy_(0.2 * noise)
    return model.eval()


def byte_tokenizer():
    """A byte-level tokenizer of VOCAB ids (each byte a token; 256.. specials), as transformers' fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {char: i for i, char in enumerate(sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(["<pad>", "<s>", "</s>", "<unk>"])
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


_ROOT: Path | None = None
_CACHE: dict[tuple[str, int], Path] = {}


def family_checkpoint(family: str, seed: int = 0) -> Path:
    """Folder with config.json, model.safetensors and the byte tokenizer of the tiny family; built once a session."""
    global _ROOT
    if _ROOT is None:
        _ROOT = Path(tempfile.mkdtemp(prefix="ilre-families-"))
        atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)
    key = (family, seed)
    if key not in _CACHE:
        folder = _ROOT / f"{family}-{seed}"
        build_family_model(family, seed).save_pretrained(str(folder), safe_serialization=True)
        byte_tokenizer().save_pretrained(str(folder))
        _CACHE[key] = folder
    return _CACHE[key]
