"""load_truncated + streaming prefill against the full transformers model, and what the loader reads."""

from __future__ import annotations

import re
import sys
from functools import lru_cache

import pytest
import safetensors
import torch
from safetensors.torch import load_file, save_file

from ilre.compressor.prefill import streaming_prefill
from ilre.compressor.prefill_config import PrefillConfig
from ilre.kernels.rope import keys_as_read
from ilre.models.loader import load_truncated
from tests.tiny_models import KINDS, N_LAYERS, copy_checkpoint, random_ids, single_thread, tiny_checkpoint  # noqa: F401

LENGTH, N_QUERY = 37, 4


@lru_cache(maxsize=None)
def hf_model(kind: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_checkpoint(kind)), dtype=torch.float32).eval()


def hf_layer_qk(kind: str, ids: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated q (H, T, d) and k (KV, T, d) of the 1-based `layer` of the FULL transformers model,
    from the hidden states entering that layer (captured by a forward pre-hook)."""
    model = hf_model(kind)
    block = model.model.layers[layer - 1]
    captured = {}

    def hook(module, args, kwargs):
        captured["h"] = args[0] if args else kwargs["hidden_states"]

    handle = block.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=ids[None])
    finally:
        handle.remove()
    attn = block.self_attn
    apply_rotary_pos_emb = sys.modules[type(attn).__module__].apply_rotary_pos_emb
    with torch.no_grad():
        h = captured["h"]  # (1, T, D)
        x = block.input_layernorm(h)
        q = attn.q_proj(x).view(1, h.shape[1], -1, attn.head_dim)  # (1, T, H, d)
        k = attn.k_proj(x).view(1, h.shape[1], -1, attn.head_dim)  # (1, T, KV, d)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        cos, sin = model.model.rotary_emb(h, torch.arange(h.shape[1])[None])
        q, k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    return q[0], k[0]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layer", [1, 2, N_LAYERS])
def test_unbounded_window_prefill_equals_full_model(kind, layer):
    # W = infinity: the Λ mask is the causal mask, so chunking must not change anything
    context, query = random_ids(LENGTH, seed=1), random_ids(N_QUERY, seed=2)
    model = load_truncated(tiny_checkpoint(kind), layer)
    state = streaming_prefill(model, context, query, PrefillConfig(sink=2, window=None, chunk=8))
    q_ref, k_ref = hf_layer_qk(kind, torch.cat((context, query)), layer)
    assert keys_as_read(state.keys[layer]).shape == (2, LENGTH, k_ref.shape[-1])
    torch.testing.assert_close(keys_as_read(state.keys[layer]), k_ref[:, :LENGTH], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state.queries[layer], q_ref[:, LENGTH:], atol=1e-5, rtol=1e-5)


def test_bounded_window_differs_from_full_model():
    # the comparison above is sensitive: a real Λ mask (W=3) changes layer-3 keys visibly
    context, query = random_ids(LENGTH, seed=1), random_ids(N_QUERY, seed=2)
    model = load_truncated(tiny_checkpoint("llama"), 3)
    state = streaming_prefill(model, context, query, PrefillConfig(sink=2, window=3, chunk=8))
    _, k_ref = hf_layer_qk("llama", torch.cat((context, query)), 3)
    assert (keys_as_read(state.keys[3])[:, 20:] - k_ref[:, 20:LENGTH]).abs().max() > 1e-2


class SpySafeOpen:
    """Wraps safetensors.safe_open and records every tensor read with get_tensor."""

    real = staticmethod(safetensors.safe_open)
    read: list[str] = []

    def __init__(self, path, framework, **kwargs):
        self._handle = self.real(path, framework=framework, **kwargs)

    def __enter__(self):
        self._inner = self._handle.__enter__()
        return self

    def __exit__(self, *exc):
        return self._handle.__exit__(*exc)

    def keys(self):
        return self._inner.keys()

    def get_tensor(self, name):
        SpySafeOpen.read.append(name)
        return self._inner.get_tensor(name)


def checkpoint_state(model) -> dict[str, torch.Tensor]:
    """The loaded module's tensors under the checkpoint's names: the fused q/k/v and gate/up
    projections split back into their parts."""
    spec, out = model.spec, {}
    sizes = {"q_proj": spec.num_heads * spec.head_dim, "k_proj": spec.num_kv_heads * spec.head_dim,
             "v_proj": spec.num_kv_heads * spec.head_dim, "gate_proj": spec.intermediate_size,
             "up_proj": spec.intermediate_size}
    for name, tensor in model.state_dict().items():
        match = re.match(r"(.*)\.(qkv_proj|gate_up_proj)\.(weight|bias)$", name)
        if not match:
            out[name] = tensor
            continue
        parts = ("gate_proj", "up_proj") if match.group(2) == "gate_up_proj" else ("q_proj", "k_proj", "v_proj")
        parts = parts[: 2 if tensor.shape[0] < sum(sizes[p] for p in parts) else 3]
        for part, piece in zip(parts, tensor.split([sizes[p] for p in parts])):
            out[f"{match.group(1)}.{part}.{match.group(3)}"] = piece
    return out


def needed_names(all_names: list[str], n_layers: int) -> set[str]:
    """Tensors a model truncated at layer n_layers needs: embeddings, full layers below it, and
    the norm + q/k/v projections (and q/k norms) of the retrieval layer itself (v for the strategies
    that read values there, e.g. lagkv)."""
    needed = {"model.embed_tokens.weight"}
    for name in all_names:
        match = re.match(r"model\.layers\.(\d+)\.(.*)", name)
        if not match:
            continue
        index, rest = int(match.group(1)), match.group(2)
        if index < n_layers - 1:
            needed.add(name)
        elif index == n_layers - 1 and re.match(r"input_layernorm|self_attn\.(q_proj|k_proj|v_proj|q_norm|k_norm)\.", rest):
            needed.add(name)
    return needed


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("layer", [1, 3, N_LAYERS])
def test_loader_reads_only_needed_tensors(kind, layer, monkeypatch):
    checkpoint = tiny_checkpoint(kind)
    with safetensors.safe_open(str(checkpoint / "model.safetensors"), framework="pt") as f:
        all_names = list(f.keys())
    monkeypatch.setattr(safetensors, "safe_open", SpySafeOpen)
    monkeypatch.setattr(SpySafeOpen, "read", [])
    model = load_truncated(checkpoint, layer)
    expected = needed_names(all_names, layer)
    assert sorted(SpySafeOpen.read) == sorted(expected)
    assert "lm_head.weight" not in SpySafeOpen.read and "model.norm.weight" not in SpySafeOpen.read
    # the module holds exactly those, none left on the meta device, nothing from layer > l_R
    params = {"model." + n for n in checkpoint_state(model)}
    assert params == expected
    assert not any(p.is_meta for p in model.parameters())
    assert len(model.layers) == layer
    assert model.inv_freq.shape == (model.spec.head_dim // 2,)


def test_loader_values_are_the_checkpoint_values():
    checkpoint = tiny_checkpoint("qwen2")
    stored = load_file(str(checkpoint / "model.safetensors"))
    model = load_truncated(checkpoint, 2)
    state = checkpoint_state(model)
    assert len(state) == len([n for n in stored if n.startswith(("model.embed", "model.layers.0.", "model.layers.1."))
                              and not re.search(r"layers\.1\.(mlp|post_attention|self_attn\.o_proj)", n)])
    for name, tensor in state.items():
        assert torch.equal(tensor, stored["model." + name]), name


def test_loader_does_not_need_tensors_above_the_retrieval_layer(tmp_path):
    folder = copy_checkpoint("llama", tmp_path / "ckpt")
    tensors = load_file(str(folder / "model.safetensors"))
    for name in list(tensors):
        if name.startswith(("model.layers.2.", "model.layers.3.", "model.norm", "lm_head")):
            del tensors[name]
    tensors.pop("model.layers.1.mlp.up_proj.weight")  # layer 2 is the retrieval layer: no MLP needed
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    model = load_truncated(folder, 2)
    assert len(model.layers) == 2
    with pytest.raises(KeyError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_truncated(folder, 3)  # layer 2 is now a full layer: its MLP is needed


def test_loader_rejects_wrong_shaped_tensor(tmp_path):
    folder = copy_checkpoint("llama", tmp_path / "ckpt")
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(16, 64)  # expected (2*16, 64)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"layers\.0\.self_attn\.k_proj\.weight.*\(16, 64\).*\(32, 64\)"):
        load_truncated(folder, 2)


@pytest.mark.parametrize("layer", [0, N_LAYERS + 1])
def test_loader_rejects_layer_out_of_range(layer):
    with pytest.raises(ValueError, match="layer"):
        load_truncated(tiny_checkpoint("llama"), layer)


@pytest.mark.parametrize("kind", KINDS)
def test_config_read_as_json_equals_transformers_config(kind):
    """load_hf_config reads config.json itself where the RoPE is the default (no transformers model configs
    imported at start) and gives the spec and RoPE frequencies transformers' config gives; other RoPE types
    are read by transformers."""
    from transformers import AutoConfig

    from ilre.models.loader import spec_from_config
    from ilre.models.spec import load_hf_config, rope_inv_freq

    checkpoint = tiny_checkpoint(kind)
    ours, theirs = load_hf_config(checkpoint), AutoConfig.from_pretrained(str(checkpoint))
    rope_type = theirs.rope_parameters["rope_type"]
    assert (type(ours) is type(theirs)) == (rope_type != "default"), rope_type
    assert spec_from_config(ours) == spec_from_config(theirs)
    (freq_ours, scale_ours), (freq_theirs, scale_theirs) = rope_inv_freq(ours), rope_inv_freq(theirs)
    assert torch.equal(freq_ours, freq_theirs) and scale_ours == scale_theirs


def test_the_embedded_tokenizer_equals_autotokenizers():
    """load_tokenizer runs the embedded checkpoint's tokenizer.json on `tokenizers` (tests/models/test_fast_tokenizer.py)
    and builds the generic fast tokenizer it names, for the rest, without AutoTokenizer's config lookup: the same
    class, ids, special tokens and chat template."""
    from transformers import AutoTokenizer

    from ilre.models.embedded import embedded_checkpoint
    from ilre.models.loader import load_tokenizer

    checkpoint = embedded_checkpoint()
    ours, theirs = load_tokenizer(checkpoint), AutoTokenizer.from_pretrained(str(checkpoint))
    assert type(ours).__name__ == "FastTokenizer" and type(ours.full) is type(theirs)
    for text in ("The passkey is 482913. Remember it.\n\n  def f(x):\treturn x", "naïve café 日本語 🙂 <|im_start|>"):
        assert ours.encode(text) == theirs.encode(text)
    assert sorted(ours.all_special_ids) == sorted(theirs.all_special_ids) and ours.eos_token_id == theirs.eos_token_id
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(chat, tokenize=False) == theirs.apply_chat_template(chat, tokenize=False)
