"""Every decoder family through its own transformers layers (models/transformers_lm.py), one tiny random checkpoint
each (tests/family_models.py): the queries and keys at l_R equal those of transformers' own forward of the whole
model (a window covering the context), equal a literal dense reference of the streaming rule (sink + window), and
no tensor above l_R is read."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from ilre.compressor.context_state import chunk_bounds
from ilre.compressor.prefill import PrefillConfig, streaming_prefill
from ilre.models.loader import load_truncated, read_tensors
from ilre.models.spec import FULL
from ilre.models.transformers_loader import load_transformers_lm
from tests.family_models import FAMILIES, L_R, N_LAYERS, VOCAB, build_family_model, family_checkpoint
from tests.tiny_models import single_thread  # noqa: F401  (autouse: one thread)

pytestmark = pytest.mark.xdist_group("families")

CONTEXT, QUERY = 60, 5
REFERENCE = "ilre_reference_test"
# float32's tolerance; a linear-attention layer's chunked recurrence adds its own rounding at chunk boundaries
TOLERANCE = {"qwen3_next": 5e-4, "qwen3_5_text": 5e-4}


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed))


def _reference(family: str, ids: torch.Tensor, visible=None) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' forward of the whole model over ids (T,): the query (H, T, dk) scaled to the default softmax
    scale and the key (KV, T, dk) that layer L_R's attention receives. visible(layer_idx, T) -> (T, T) bool or None:
    the mask of that layer (None: the model's own)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    captured = {}

    def attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
        layer = module.layer_idx
        if layer == L_R - 1:
            factor = 1.0 if scaling is None else scaling * math.sqrt(query.shape[-1])
            captured["q"], captured["k"] = (query[0] * factor).detach(), key[0].detach()
        mask = visible(layer, query.shape[2]) if visible is not None else None
        if mask is not None:
            attention_mask = torch.zeros(mask.shape, dtype=query.dtype).masked_fill(~mask, -math.inf)[None, None]
        eager = sys.modules[type(module).__module__].eager_attention_forward
        return eager(module, query, key, value, attention_mask, scaling=scaling, **kwargs)

    AttentionInterface.register(REFERENCE, attention)
    AttentionMaskInterface.register(REFERENCE, eager_mask)
    model = build_family_model(family)
    model.config._attn_implementation = REFERENCE
    model.set_attn_implementation(REFERENCE)
    with torch.no_grad():
        model(ids[None])
    return captured["q"], captured["k"]


def _ours(family: str, config: PrefillConfig, path: str = "auto"):
    model = load_truncated(family_checkpoint(family), L_R, path=path)
    context, query = _ids(CONTEXT, 1), _ids(QUERY, 2)
    state = streaming_prefill(model, context, query, config)
    return model, state.keys[L_R], state.queries[L_R], torch.cat((context, query))


@pytest.mark.parametrize("family", FAMILIES)
def test_window_covering_context_equals_transformers_forward(family):
    model, keys, queries, ids = _ours(family, PrefillConfig(sink=2, window=None, chunk=16))
    want_q, want_k = _reference(family, ids)
    tol = TOLERANCE.get(family, 1e-4)
    torch.testing.assert_close(keys, want_k[:, :CONTEXT], rtol=tol, atol=tol)
    torch.testing.assert_close(queries, want_q[:, CONTEXT:], rtol=tol, atol=tol)


def _literal(config: PrefillConfig, kinds: tuple[str, ...]):
    """The streaming rule as a dense mask: in a full-attention layer below l_R, token i (in a chunk starting at c,
    the query's chunk starting at CONTEXT) sees j <= i where j < sink or j >= c - window; other layers their own."""
    starts = torch.empty(CONTEXT + QUERY, dtype=torch.int64)
    for start, end in chunk_bounds(CONTEXT, config):
        starts[start:end] = start
    starts[CONTEXT:] = CONTEXT

    def visible(layer: int, n: int):
        if layer >= L_R - 1 or kinds[layer] != FULL:
            return None
        i, j = torch.arange(n).unsqueeze(1), torch.arange(n).unsqueeze(0)
        return (j <= i) & ((j < config.sink) | (j >= starts[:n].unsqueeze(1) - config.window))
    return visible


@pytest.mark.parametrize("family", FAMILIES)
def test_sink_and_window_equal_a_literal_reference(family):
    config = PrefillConfig(sink=2, window=6, chunk=8)
    model, keys, queries, ids = _ours(family, config)
    kinds = tuple(model.spec.kind(l) for l in range(1, N_LAYERS + 1)) if model.spec.layer_kinds else (FULL,) * 6
    want_q, want_k = _reference(family, ids, _literal(config, kinds))
    tol = TOLERANCE.get(family, 1e-4)
    torch.testing.assert_close(keys, want_k[:, :CONTEXT], rtol=tol, atol=tol)
    torch.testing.assert_close(queries, want_q[:, CONTEXT:], rtol=tol, atol=tol)


@pytest.mark.parametrize("family", FAMILIES)
def test_no_tensor_above_lr_is_read(family):
    read: list[str] = []

    def counting(checkpoint, names, device, dtype):
        read.extend(names)
        return read_tensors(checkpoint, names, device, dtype)

    load_transformers_lm(family_checkpoint(family), L_R, torch.float32, "cpu", counting)
    layers = {int(name.split(".")[1]) for name in read if name.startswith("layers.")}
    assert layers == set(range(L_R))  # 0-based: layers 1..l_R
    top = [name for name in read if name.startswith(f"layers.{L_R - 1}.")]
    assert top and not any(part in name for name in top for part in ("mlp", "experts", "feed_forward"))
    assert any("embed" in name for name in read)


def test_the_fast_path_is_chosen_where_it_applies_and_agrees_with_the_family_path():
    from ilre.models.llama import TruncatedLM
    from ilre.models.transformers_lm import TransformersLM

    config = PrefillConfig(sink=2, window=6, chunk=8)
    fast, keys, queries, _ = _ours("llama", config)
    slow, keys_t, queries_t, _ = _ours("llama", config, path="transformers")
    assert isinstance(fast, TruncatedLM) and isinstance(slow, TransformersLM)
    assert isinstance(load_truncated(family_checkpoint("gemma3_text"), L_R), TransformersLM)
    torch.testing.assert_close(keys, keys_t, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(queries, queries_t, rtol=1e-5, atol=1e-5)


def test_a_retrieval_layer_without_global_attention_is_refused():
    with pytest.raises(ValueError, match=r"layer: l_R = 3 is a sliding_attention layer .*global layers: \[4, 6\]"):
        load_truncated(family_checkpoint("gemma3_text"), 3)


def test_a_learned_sparse_selection_is_refused_with_its_reason():
    from transformers import AutoConfig

    from ilre.models.loader import spec_from_config

    config = AutoConfig.for_model("deepseek_v32")
    with pytest.raises(ValueError, match="learned sparse selection"):
        spec_from_config(config)


def test_a_layer_reusing_another_layers_keys_is_refused_as_l_r(tmp_path):
    """Gemma 4's last layers attend with an earlier layer's keys and values: l_R there is refused naming the
    highest l_R allowed."""
    from tests.family_models import family_config

    config = family_config("gemma4_text")
    config.num_kv_shared_layers = 2
    config.save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="one of the last 2 layers .* l_R must be at most 4"):
        load_transformers_lm(tmp_path, 6, torch.float32, "cpu", read_tensors)


def test_vocab_is_the_checkpoints():
    assert load_truncated(family_checkpoint("phi3"), L_R).spec.vocab_size == VOCAB


# families this project names nowhere: a dense one and a MoE one, through the real command
UNNAMED = {"olmo2": {}, "granitemoe": dict(num_local_experts=4, num_experts_per_tok=2)}


@pytest.mark.parametrize("family", [*UNNAMED, "gpt_oss", "qwen3_5_text"])
def test_compress_command_on_a_family_keeps_its_tokenizers_ids(family, tmp_path):
    import json
    import subprocess

    from tests.family_models import _COMMON, byte_tokenizer, family_checkpoint

    if family in UNNAMED:
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.for_model(family, **{**_COMMON, **UNNAMED[family]})
        folder = tmp_path / family
        AutoModelForCausalLM.from_config(config).save_pretrained(str(folder))
        byte_tokenizer().save_pretrained(str(folder))
    else:
        folder = family_checkpoint(family)
    context = " ".join(f"Line {i}: the value of key{i} is {i * 7}." for i in range(40))
    (tmp_path / "context.txt").write_text(context)
    done = subprocess.run([sys.executable, "-m", "ilre.cli", "compress", "--model", str(folder), "--layer", str(L_R),
                           "--budget", "64", "--granularity", "token", "--query", "What is key5?", "--json", "--context-file",
                           str(tmp_path / "context.txt")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    ids = byte_tokenizer()(context, add_special_tokens=False).input_ids
    query = byte_tokenizer()("What is key5?", add_special_tokens=False).input_ids
    assert len(result["kept_indices"]) == 64
    assert result["token_ids"] == [ids[i] for i in result["kept_indices"]] + query  # the kept context, the query
    assert result["layer"] == L_R
