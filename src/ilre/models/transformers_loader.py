"""Build a TransformersLM (models/transformers_lm.py) from a checkpoint folder: the family's own decoder model
truncated at l_R, with only the embeddings, layers 1..l_R-1 and layer l_R up to its attention read from the files."""

from __future__ import annotations

import copy
import re
from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from .spec import CHUNKED, FULL, LINEAR, SLIDING
from .transformers_lm import ATTENTION, AttentionCall, LayerRule, TransformersLM, register_attention
from .rotations import find_rotation, rotary_frequencies
from .transformers_spec import transformers_spec

_LAYER = re.compile(r"^layers\.(\d+)\.([^.]+)")


def truncated_config(config, n_layers: int):
    """A copy of a text config with `n_layers` layers: num_hidden_layers and every per-layer list cut there."""
    out = copy.deepcopy(config)
    total = config.num_hidden_layers
    for name, value in vars(config).items():
        if isinstance(value, (list, tuple)) and len(value) == total and total != n_layers:
            setattr(out, name, type(value)(value[:n_layers]))
    out.num_hidden_layers = n_layers
    out._attn_implementation = ATTENTION
    return out


def _before_attention(component: str) -> bool:
    """Whether a decoder layer's submodule `component` runs before its attention's scores, by its name (where the
    layer cannot be traced: `used_before_attention`): the attention itself and the norm in front of it."""
    if component.startswith("post_"):
        return False
    return "attn" in component or "attention" in component or component in ("input_layernorm", "input_norm", "ln_1")


def used_before_attention(base: nn.Module, spec, n_layers: int) -> set[str] | None:
    """The state names of layer n_layers' tensors that its forward uses up to its attention call, traced on a
    two-token input through `base` before its weights are read (their values do not matter), or None where the
    layer cannot be run so (judged by name then)."""
    model = TransformersLM(base, spec, n_layers, [], None)
    layer = model.layer(n_layers)
    prefix = f"layers.{n_layers - 1}"
    names = {module: f"{prefix}.{name}".rstrip(".") for name, module in layer.module.named_modules()}
    entered: list[nn.Module] = []
    hooks = [m.register_forward_pre_hook(lambda module, args: entered.append(module)) for m in names]
    try:
        with torch.no_grad():
            run, _ = layer._start(torch.zeros(1, 2, spec.hidden_size), torch.arange(2))
        if not run.dead:
            run.throw()
    except Exception:  # data-dependent code (an .item(), a routing decision) before the attention
        return None
    finally:
        for hook in hooks:
            hook.remove()
    return {f"{names[m]}.{p}" for m in entered for p, _ in m.named_parameters(recurse=False)} | {
        f"{names[m]}.{b}" for m in entered for b, _ in m.named_buffers(recurse=False)}


def wanted_names(state_names: list[str], n_layers: int, top: set[str] | None = None) -> list[str]:
    """The tensors a model truncated at n_layers reads: everything outside the layers (the embeddings; the final
    norm is dropped), every tensor of layers 1..n_layers-1, and of layer n_layers what runs before its attention
    (`top`, as traced by `used_before_attention`; None: judged by name)."""
    out = []
    for name in state_names:
        match = _LAYER.match(name)
        if match is None or int(match.group(1)) < n_layers - 1:
            out.append(name)
        elif name in top if top is not None else _before_attention(match.group(2)):
            out.append(name)
    return out


def load_transformers_lm(checkpoint: Path, n_layers: int, dtype: torch.dtype, device: torch.device | str,
                         read: Callable[..., dict[str, torch.Tensor]], latent_keys: bool = True) -> TransformersLM:
    """The checkpoint's family model truncated at `n_layers` (l_R), its tensors read by `read(checkpoint, names,
    device, dtype)` (only those `wanted_names` lists; every other parameter left on the meta device, so that any
    use of one fails loudly). latent_keys: an MLA retrieval layer keeps one latent key per token (the query
    absorbs the key up-projection) rather than per-head keys. Raises ValueError naming the architecture and why
    where it cannot be loaded."""
    from transformers import AutoConfig, AutoModel
    from transformers.initialization import no_init_weights

    register_attention()
    config = AutoConfig.from_pretrained(str(checkpoint))
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    spec = transformers_spec(text)
    if not 1 <= n_layers <= spec.num_layers:
        raise ValueError(f"layer: must be in 1..{spec.num_layers} (got {n_layers})")
    if spec.kind(n_layers) != FULL:
        raise ValueError(f"layer: l_R = {n_layers} is a {spec.kind(n_layers)} layer of {spec.model_type}, which "
                         f"cannot see the whole context; its global layers: {list(spec.global_layers)}")
    shared = int(getattr(text, "num_kv_shared_layers", 0) or 0)
    if n_layers > spec.num_layers - shared:  # their attention reads an earlier layer's keys: no stream of their own
        raise ValueError(f"layer: l_R = {n_layers} is one of the last {shared} layers of {spec.model_type}, which "
                         f"reuse earlier layers' keys and values; l_R must be at most {spec.num_layers - shared}")
    truncated = truncated_config(text, n_layers)
    try:
        with no_init_weights():
            base = AutoModel.from_config(truncated, attn_implementation=ATTENTION)
        traced = used_before_attention(base, spec, n_layers)
    except Exception as exc:  # a family transformers cannot build from this config
        raise ValueError(f"model: architecture {spec.model_type!r} could not be built by transformers "
                         f"({type(exc).__name__}: {exc})") from exc
    if not hasattr(base, "layers"):
        raise ValueError(f"model: architecture {spec.model_type!r} has no decoder layers list (`layers`) to stream")
    try:
        base = _read_by_name(base, checkpoint, n_layers, dtype, device, read, traced)
    except KeyError:  # stored under other names (e.g. one tensor per expert): transformers' own conversion
        base = _converted(checkpoint, truncated, dtype, device, n_layers, traced)
    model = TransformersLM(base, spec, n_layers, [], None)
    model.find_token_inputs()
    model.rules = _rules(model, text)
    top = model.rules[-1]  # the retrieval layer's shapes are what its keys and queries have
    model.spec = replace(spec, num_heads=top.heads, num_kv_heads=top.kv_heads, head_dim=top.head_dim,
                         v_head_dim=top.v_dim if top.v_dim != top.head_dim else 0)
    mla = model.layer(n_layers).mla
    model.latent_keys = latent_keys and mla is not None
    if model.latent_keys:  # one key head: the latent and the shared rotated key
        width = mla.kv_a_layernorm.weight.shape[0] + top.head_dim - mla.qk_nope_head_dim
        model.spec = replace(model.spec, num_kv_heads=1, head_dim=width, v_head_dim=0)
    model.inv_freq = _rotations(model)
    return model


def _read_by_name(base: nn.Module, checkpoint: Path, n_layers: int, dtype: torch.dtype, device,
                  read: Callable[..., dict[str, torch.Tensor]], top: set[str] | None) -> nn.Module:
    """`base` with the tensors `wanted_names` lists read by their names (KeyError where the files name them
    otherwise); every other parameter left on the meta device, so that any use of one fails loudly."""
    if isinstance(getattr(base, "norm", None), nn.Module):
        base.norm = nn.Identity()  # the final norm is never reached
    names = [n for n in base.state_dict() if not n.startswith("norm.")]
    keep_fp32 = tuple(getattr(base, "_keep_in_fp32_modules", None) or ())
    tensors = read(checkpoint, wanted_names(names, n_layers, top), device, None)
    params = dict(base.named_parameters())
    stored = _stored_layers(checkpoint)
    for name, tensor in list(tensors.items()):
        expected = params[name].shape if name in params else base.get_buffer(name).shape
        tensor = tensors[name] = _per_layer_part(tensor, tuple(expected), n_layers, stored)
        if tuple(tensor.shape) != tuple(expected):
            raise ValueError(f"model: {name} has shape {tuple(tensor.shape)}, expected {tuple(expected)}")
        fp32 = any(part in name.split(".") for part in keep_fp32)
        tensors[name] = tensor.to(torch.float32 if fp32 and tensor.is_floating_point() else
                                  dtype if tensor.is_floating_point() else tensor.dtype)
    base.load_state_dict(tensors, strict=False, assign=True)
    base = base.to(device).eval().requires_grad_(False)
    for name, param in params.items():
        if name not in tensors:  # the retrieval layer's MLP: never run, never read
            module, _, attr = name.rpartition(".")
            base.get_submodule(module)._parameters[attr] = nn.Parameter(torch.empty_like(param, device="meta"),
                                                                        requires_grad=False)
    return base


def _stored_layers(checkpoint: Path) -> int:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(checkpoint))
    return (config.get_text_config() if hasattr(config, "get_text_config") else config).num_hidden_layers


def _per_layer_part(tensor: torch.Tensor, expected: tuple[int, ...], n_layers: int, total: int) -> torch.Tensor:
    """A tensor that packs something per layer along one dimension (e.g. per-layer input embeddings) cut to the
    first n_layers' part; any other tensor as it is."""
    if tensor.dim() != len(expected) or tuple(tensor.shape) == expected:
        return tensor
    differ = [d for d in range(tensor.dim()) if tensor.shape[d] != expected[d]]
    if len(differ) == 1 and tensor.shape[differ[0]] * n_layers == expected[differ[0]] * total:
        return tensor.narrow(differ[0], 0, expected[differ[0]])
    return tensor


def _converted(checkpoint: Path, truncated, dtype: torch.dtype, device, n_layers: int, top: set[str] | None
               ) -> nn.Module:
    """The truncated model loaded by transformers' `from_pretrained`, whose weight conversions (experts stored one
    by one, fused or split projections) map the stored names to the model's. Layers above are not in the model,
    so their tensors are never read; those of layer n_layers that run after its attention (not in `top`) are
    renamed out of its way (`key_mapping`), unread too, unless a tensor `top` names comes out missing."""
    from safetensors import safe_open
    from transformers import AutoModel

    layer = f"layers.{n_layers - 1}."
    stored = [name for f in sorted(checkpoint.glob("*.safetensors"))
              for name in safe_open(str(f), framework="pt").keys()]
    after = [name for name in stored if layer in name and top is not None
             and name[name.index(layer):] not in top and name.index(layer) in (0, name.find(".") + 1)]

    def load(skipped: list[str]) -> tuple[nn.Module, dict]:
        mapping = {"^(" + "|".join(re.escape(n) for n in skipped) + ")$": r"ilre_unread.\1"} if skipped else None
        return AutoModel.from_pretrained(str(checkpoint), config=truncated, dtype=dtype, attn_implementation=ATTENTION,
                                         key_mapping=mapping, output_loading_info=True)

    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its load report lists the tensors left out on purpose
    try:
        base, info = load(after)
        if after and set(info.get("missing_keys", ())) & top:
            base, info = load([])
    finally:
        hf_logging.set_verbosity(verbosity)
    if isinstance(getattr(base, "norm", None), nn.Module):
        base.norm = nn.Identity()
    base = base.to(device).eval().requires_grad_(False)
    for name in set(info.get("missing_keys", ())) - (top or set()):  # never run: left on meta, any use fails loudly
        if name.startswith(layer):
            module, _, attr = name.rpartition(".")
            param = base.get_submodule(module)._parameters.get(attr)
            if param is not None:
                base.get_submodule(module)._parameters[attr] = nn.Parameter(torch.empty_like(param, device="meta"),
                                                                            requires_grad=False)
    return base


def _rules(model: TransformersLM, config) -> list[LayerRule]:
    """Each layer's LayerRule, from what its attention receives on a two-token input (its kind from the config;
    a window the attention names makes a full layer sliding)."""
    ids = torch.zeros(2, dtype=torch.int64, device=model.device)
    positions = torch.arange(2, device=model.device)
    h = model.embed(ids)
    rules = []
    for index in range(1, model.n_layers + 1):
        kind = model.spec.kind(index)
        if kind == LINEAR:
            rules.append(LayerRule(LINEAR))
            continue
        run, call = model.layer(index)._start(h, positions)
        if not isinstance(call, AttentionCall):
            raise ValueError(f"model: layer {index} of {model.spec.model_type!r} ({kind}) made no attention call")
        run.throw()
        window = call.sliding_window
        if kind == CHUNKED:
            window = int(getattr(config, "attention_chunk_size", 0) or 0) or None
        elif window:
            kind = SLIDING
        rules.append(LayerRule(kind, window, call.sinks, call.query.shape[1], call.key.shape[1], call.key.shape[-1],
                               call.value.shape[-1]))
    return rules


def _rotations(model: TransformersLM) -> torch.Tensor | None:
    """Each global layer's Rotation (models/rotations.py) set on its rule, checked on its keys at two positions;
    returns l_R's frequencies (DCA's moves of keys and queries there) where every global layer up to l_R has
    one, else None (the rules left as they were: DCA off)."""
    frequencies = rotary_frequencies(model.base)
    generator = torch.Generator().manual_seed(0)
    h = torch.randn(4, model.residual_width, generator=generator).to(model.device, model.dtype)
    found = {}
    for index, rule in enumerate(model.rules, start=1):
        if rule.kind != FULL:
            continue
        layer = model.layer(index)
        found[index] = find_rotation(lambda at: layer.keys(h, at.to(model.device), at.to(model.device)),
                                     frequencies, model.dtype)
        if found[index] is None:
            return None
    for index, rotation in found.items():
        model.rules[index - 1] = replace(model.rules[index - 1], perm=rotation.perm, inv_freq=rotation.inv_freq)
    return found[model.n_layers].inv_freq
