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
from ilre.compressor.prefill import streaming_prefill
from ilre.compressor.prefill_config import PrefillConfig
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


def _logits(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """(H, Tq, dk) queries against (KV, L, dk) keys -> (H, Tq, L) softmax logits at the default scale."""
    group = queries.shape[0] // keys.shape[0]
    return torch.einsum("htd,hld->htl", queries, keys.repeat_interleave(group, 0)) / keys.shape[-1] ** 0.5


def _assert_same(model, keys, queries, want_k, want_q, tol: float) -> None:
    """Our keys and queries at l_R are transformers' (their dims in the order of the layer's rotation; an MLA layer
    scored from its latent: the logits are)."""
    want_k, want_q = want_k[:, :CONTEXT], want_q[:, CONTEXT:]
    torch.testing.assert_close(_logits(queries, keys), _logits(want_q, want_k), rtol=tol, atol=tol)
    if not getattr(model, "latent_keys", False):
        perm = model.rules[L_R - 1].perm if hasattr(model, "rules") else None  # the order DCA's moves take them in
        if perm is not None:
            want_k, want_q = want_k[..., perm], want_q[..., perm]
        torch.testing.assert_close(keys, want_k, rtol=tol, atol=tol)
        torch.testing.assert_close(queries, want_q, rtol=tol, atol=tol)


@pytest.mark.parametrize("family", FAMILIES)
def test_window_covering_context_equals_transformers_forward(family):
    model, keys, queries, ids = _ours(family, PrefillConfig(sink=2, window=None, chunk=16))
    want_q, want_k = _reference(family, ids)
    _assert_same(model, keys, queries, want_k, want_q, TOLERANCE.get(family, 1e-4))


def test_an_mla_retrieval_layer_keeps_one_latent_key_per_token():
    """DeepSeek's l_R keeps [latent, rotated key] per token (kv_lora_rank 32 + rope 8 here) instead of 4 heads of
    16 + 8; its logits equal per-head keys' (the test above), and per-head keys stay one option away."""
    model, keys, queries, _ = _ours("deepseek_v3", PrefillConfig(sink=2, window=None, chunk=16))
    assert model.latent_keys and keys.shape == (1, CONTEXT, 40) and queries.shape == (4, QUERY, 40)
    per_head = load_transformers_lm(family_checkpoint("deepseek_v3"), L_R, torch.float32, "cpu", read_tensors,
                                    latent_keys=False)
    assert (per_head.spec.num_kv_heads, per_head.spec.head_dim) == (4, 24)
    with pytest.raises(ValueError, match="no per-head values"):
        model.layer(L_R).parts(torch.zeros(3, model.residual_width), torch.arange(3), torch.arange(3), ("values",))


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
    _assert_same(model, keys, queries, want_k, want_q, TOLERANCE.get(family, 1e-4))


class _CountingFile:
    """A safetensors file as transformers' loader opens it, recording each tensor it reads (indexes a slice of)."""

    def __init__(self, opened, read: list[str]):
        self._opened, self._read = opened, read

    def get_slice(self, name: str):
        return _CountingSlice(self._opened.get_slice(name), name, self._read)

    def get_tensor(self, name: str):
        self._read.append(name)
        return self._opened.get_tensor(name)

    def __getattr__(self, attr):
        return getattr(self._opened, attr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._opened.__exit__(*exc)


class _CountingSlice:
    def __init__(self, inner, name: str, read: list[str]):
        self._inner, self._name, self._read = inner, name, read

    def __getitem__(self, index):
        self._read.append(self._name)
        return self._inner[index]

    def __getattr__(self, attr):
        return getattr(self._inner, attr)


@pytest.mark.parametrize("family", FAMILIES)
def test_no_tensor_above_lr_is_read(family, monkeypatch):
    """Counted on both ways of reading: by name, and transformers' own loader (checkpoints storing experts one by
    one), whose file reads are counted where it materialises a tensor."""
    import transformers.modeling_utils as modeling_utils

    read: list[str] = []

    def counting(checkpoint, names, device, dtype):
        got = read_tensors(checkpoint, names, device, dtype)
        read.extend(got)
        return got

    opener = modeling_utils.safe_open
    monkeypatch.setattr(modeling_utils, "safe_open", lambda *a, **k: _CountingFile(opener(*a, **k), read))
    load_transformers_lm(family_checkpoint(family), L_R, torch.float32, "cpu", counting)
    layers = {int(name.split(".")[-len(name.split(".")) + name.split(".").index("layers") + 1])
              for name in read if ".layers." in f".{name}"}
    assert layers == set(range(L_R))  # 0-based: layers 1..l_R
    top = [name for name in read if f"layers.{L_R - 1}." in name]
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


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "gemma4_text"])
def test_dca_moves_each_global_layers_keys_as_its_own_rope_turns_them(family):
    """DCA's move of keys rotated to p (kernels/rope.rerotate with the layer's frequencies, its dims in the order
    models/rotations.py found) gives the keys the family's own layer computes at p + s: full, partial (glm4_moe,
    minimax_m2, qwen3_next), interleaved or latent-and-rope (deepseek_v3) and no-RoPE layers (llama4's l_R)."""
    from ilre.kernels.rope import rerotate

    model = load_truncated(family_checkpoint(family), L_R, path="transformers")
    assert model.inv_freq is not None  # --dca on is accepted
    h = torch.randn(5, model.residual_width, generator=torch.Generator().manual_seed(3))
    at = torch.arange(10, 15)
    for index, rule in enumerate(model.rules, start=1):
        if rule.kind != FULL:
            continue
        layer = model.layer(index)
        for shift in (8, 5000):
            moved = rerotate(layer.keys(h, at, at), rule.inv_freq, shift)
            torch.testing.assert_close(moved, layer.keys(h, at + shift, at + shift), rtol=2e-4, atol=2e-4)


def test_dca_past_the_window_agrees_between_the_fast_and_the_family_path():
    config = PrefillConfig(sink=2, window=6, chunk=8, dca=True)
    _, keys, queries, _ = _ours("llama", config)
    _, keys_t, queries_t, _ = _ours("llama", config, path="transformers")
    assert keys.spans == keys_t.spans  # the query's moves past each span of chunks (kernels/rope.MovedKeys)
    torch.testing.assert_close(keys.keys, keys_t.keys, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(queries, queries_t, rtol=1e-5, atol=1e-5)
    _, plain, _, _ = _ours("llama", PrefillConfig(sink=2, window=6, chunk=8))
    assert not torch.allclose(plain, keys.keys, atol=1e-3)  # the sink moves below l_R changed what l_R sees


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


@pytest.mark.parametrize("family", FAMILIES)
def test_a_compressed_reply_gives_the_checkpoints_own_token_ids(family):
    """In process, as the service runs it: the kept indices' token IDs are the checkpoint's tokenizer's."""
    from ilre.engine.engine import Engine, EngineConfig
    from ilre.contract.messages import CompressRequest
    from tests.family_models import byte_tokenizer

    engine = Engine(EngineConfig(model=str(family_checkpoint(family)), layer=L_R, doc_cache_mb=0))
    context = " ".join(f"Line {i}: the value of key{i} is {i * 7}." for i in range(12))
    ids, query = byte_tokenizer()(context).input_ids, byte_tokenizer()("What is key5?").input_ids
    result = engine.compress(CompressRequest(context=context, query="What is key5?", budget=48))
    assert len(result.kept_indices) == 48
    assert list(result.token_ids) == [ids[i] for i in result.kept_indices] + query
