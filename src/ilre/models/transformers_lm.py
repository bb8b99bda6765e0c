"""Any decoder family transformers has, through its own layers, as the streaming prefill drives them.

`TransformersLM` offers what `models/llama.py`'s TruncatedLM offers the prefill (embed, rope, layer(l).qkv /
finish / parts), built from the checkpoint's own transformers modules truncated at l_R, so a family transformers
adds runs with no code here. Its norms, projections, RoPE variant, QK-norm, MoE routing, multipliers and parallel
blocks are the family's code; only the attention itself is the prefill's:

- A layer's call runs in a greenlet. transformers hands each attention layer's q, k, v to the function registered
  under ATTENTION (its attention-function registry, `AttentionInterface`); that function switches back to the
  prefill with them (`qkv`), which attends by its streaming rule and switches in again with the output (`finish`):
  the layer goes on with its own o_proj, residual, norms and MLP. q comes back scaled so that softmax(q k / sqrt(d))
  is the family's own scaling.
- A layer without attention (linear attention, state-space mixers) runs whole in `finish`, carrying its own
  recurrent state from chunk to chunk in a transformers cache (exact): compressor/layer_caches.py.
- Each layer's keyword inputs (position embeddings per layer type, position ids) are what the family's own model
  forward hands it: `layer_inputs` runs that forward with every layer replaced by a recorder.
- Inputs a layer takes from each token alone (Gemma 4's per-layer input embeddings, read from the ids) travel with
  the residual stream: `embed` appends them to the hidden state ((..., T, D + their widths): `residual_width`), each
  layer takes its own part and hands the rest on unchanged.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from greenlet import GreenletExit, getcurrent, greenlet
from torch import nn

from .spec import FULL, LINEAR, ModelSpec

ATTENTION = "ilre_split"  # the attention implementation name registered with transformers


@dataclass
class AttentionCall:
    """What a layer handed its attention: query (B, H, T, dk), key and value (B, KV, T, dk|dv), the family's
    scaling (None: dk ** -0.5), its sliding window (None: global) and sink logits (H,) where it has them."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    scaling: float | None
    sliding_window: int | None
    sinks: torch.Tensor | None


@dataclass(frozen=True)
class TokenInput:
    """A layer input made from each token alone (e.g. a per-layer input embedding): the 1-based layer taking it,
    where (a positional index after the hidden state, or a keyword), its width and its columns in the stream."""

    layer: int
    slot: int | str
    width: int
    start: int


@dataclass(frozen=True)
class LayerRule:
    """How one layer attends: kind (spec FULL, SLIDING, CHUNKED or LINEAR); window: a sliding layer's window (a
    token sees the `window` latest positions, itself included) or a chunked layer's chunk; sinks: (H,) float32 sink
    logits; heads: its query heads; kv_heads, head_dim, v_dim: its cache's shapes; perm, inv_freq: its keys' turn
    with position as models/rotations.py's Rotation."""

    kind: str
    window: int | None = None
    sinks: torch.Tensor | None = None
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    v_dim: int = 0
    perm: torch.Tensor | None = None  # the order of a head's dims its queries and keys are handed in (rotations.py)
    inv_freq: torch.Tensor | None = None  # its RoPE's frequencies in that order (DCA's moves), None: not moved

    @property
    def plain(self) -> bool:
        """Whether the layer is what the prefill's sink + window rule alone computes (full attention, no sinks)."""
        return self.kind == FULL and self.sinks is None


def _split_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None,
                     s_aux=None, **kwargs):
    """The registered attention function: hands q, k, v to the prefill driving this layer and returns its output,
    (B, T, H, dv) as transformers' attention functions do."""
    parent = getcurrent().parent
    if parent is None:
        raise RuntimeError(f"{ATTENTION}: an attention layer called outside the streaming prefill")
    sinks = None if s_aux is None else s_aux.detach().float()
    return parent.switch(AttentionCall(query, key, value, scaling, sliding_window, sinks)), None


def _no_mask(*args, **kwargs):
    """The prefill makes its own masks: transformers builds none."""
    return None


def register_attention() -> None:
    """Register ATTENTION with transformers' attention and mask registries (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION, _split_attention)
    AttentionMaskInterface.register(ATTENTION, _no_mask)


class TransformersLayer:
    """Layer `index` (1-based) of a TransformersLM, split at its attention (see the module docstring)."""

    def __init__(self, owner: "TransformersLM", index: int, module: nn.Module):
        self.owner, self.index, self.module = owner, index, module
        self.kind = owner.spec.kind(index)
        self._pending: dict[tuple, greenlet] = {}
        self.mla = next((m for m in module.modules() if hasattr(m, "kv_b_proj") and hasattr(m, "kv_a_layernorm")),
                        None)  # multi-head latent attention: keys and values from one latent per token

    def _start(self, h: torch.Tensor, positions: torch.Tensor, cache=None) -> tuple[greenlet, object]:
        """Run the layer over h ((T, D) or (B, T, D)) at `positions` until it hands over its attention: the
        suspended call and the AttentionCall (or, for a layer without attention, its output)."""
        batched = h if h.dim() == 3 else h.unsqueeze(0)
        args, kwargs = self.owner.layer_inputs(positions, batched.shape[0])[self.index - 1]
        if cache is not None:
            kwargs = {**kwargs, _cache_keyword(kwargs): cache}
        args, kwargs = self.owner.with_token_inputs(self.index, batched, args, kwargs)
        hidden = batched[..., : self.owner.spec.hidden_size]
        run = greenlet(lambda: self.module(hidden, *args, **kwargs))
        return run, run.switch()

    def qkv(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h: (..., T, D); cos = sin = positions (the model's `rope`) -> q (..., H, T, dk) scaled to the family's
        softmax scale, k (..., KV, T, dk) and v (..., KV, T, dv), as the layer's attention receives them. A layer
        without attention gives back (h, h, h): its cache runs it whole (compressor/layer_caches.py)."""
        if self.kind == LINEAR:
            return h, h, h
        run, call = self._start(h, cos)
        if not isinstance(call, AttentionCall):
            raise RuntimeError(f"layer {self.index}: no attention call in a {self.kind} layer")
        self._pending[_key(h)] = run
        q, k, v = self._permuted(_scaled(call)), self._permuted(call.key), call.value
        return (q, k, v) if h.dim() == 3 else (q[0], k[0], v[0])

    def _permuted(self, x: torch.Tensor) -> torch.Tensor:
        """Queries or keys (..., d) in the order of the layer's rotation (as they are where it has none)."""
        rules = self.owner.rules
        perm = rules[self.index - 1].perm if len(rules) >= self.index else None
        return x if perm is None else x.index_select(-1, perm.to(x.device))

    def drop(self, h: torch.Tensor) -> None:
        """A `qkv` of h whose `finish` will not come: its suspended layer call is ended (else it holds the chunk's
        tensors until the model goes)."""
        run = self._pending.pop(_key(h), None)
        if run is not None and not run.dead:
            run.throw(GreenletExit)

    def finish(self, h: torch.Tensor, attn_out) -> torch.Tensor:
        """h: (..., T, D) as given to `qkv`; attn_out: (..., H, T, dv) the attention's output (for a layer without
        attention, the cache to run it with) -> the layer's output (..., T, D)."""
        if self.kind == LINEAR:
            run, done = self._start(h, attn_out.positions, attn_out.cache)
        else:
            run = self._pending.pop(_key(h))
            out = attn_out if attn_out.dim() == 4 else attn_out.unsqueeze(0)
            done = run.switch(out.transpose(1, 2).to(self.owner.dtype))
        done = done[0] if isinstance(done, tuple) else done
        done = done if h.dim() == 3 else done[0]
        width = self.owner.spec.hidden_size
        return done if h.shape[-1] == width else torch.cat([done, h[..., width:]], dim=-1)

    def parts(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, wanted: tuple[str, ...]
              ) -> dict[str, torch.Tensor]:
        """h: (T, D) -> the wanted of queries (H, T, dk, scaled as `qkv`'s), keys and values (KV, T, d); the layer's
        call stops at its attention."""
        unknown = set(wanted) - {"queries", "keys", "values"}
        if unknown:
            raise ValueError(f"parts: {sorted(unknown)} are states before RoPE, which a transformers layer does not "
                             "hand out (a strategy that reads them needs a fast-path model)")
        latent = self.index == self.owner.n_layers and self.owner.latent_keys and self.mla is not None
        if latent and "values" in wanted:
            raise ValueError("parts: an MLA retrieval layer is scored from its latent: it has no per-head values "
                             "(a strategy that reads them needs per-head keys: latent_keys off)")
        captured: list[torch.Tensor] = []
        hook = self.mla.kv_a_layernorm.register_forward_hook(lambda m, a, out: captured.append(out)) if latent else None
        try:
            run, call = self._start(h, cos)
        finally:
            if hook is not None:
                hook.remove()
        if not run.dead:
            run.throw(GreenletExit)  # the rest of the layer is not needed
        got = (_latent_parts(self.mla, call, captured[-1], wanted) if latent else
               {"queries": _scaled(call), "keys": call.key, "values": call.value})
        got.update({name: self._permuted(got[name]) for name in ("queries", "keys") if name in got})
        return {name: got[name][0] if h.dim() == 2 else got[name] for name in wanted}

    def queries(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.parts(h, cos, sin, ("queries",))["queries"]

    def keys(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.parts(h, cos, sin, ("keys",))["keys"]


def _latent_parts(mla: nn.Module, call: AttentionCall, latent: torch.Tensor, wanted: tuple[str, ...]
                  ) -> dict[str, torch.Tensor]:
    """Multi-head latent attention's `wanted` of queries and keys with the key up-projection absorbed into the
    query, so that the key cache is one latent per token: keys (B, 1, T, r + dr) = [c, k_rope] from the latent c
    (B, T, r) and the shared rotated key; queries (B, H, T, r + dr) = [W_UK^T q_nope, q_rope], scaled so that the
    default softmax scale of their width gives the family's q.k scaling (q.k = q_nope.(W_UK c) + q_rope.k_rope)."""
    nope = mla.qk_nope_head_dim
    got = {}
    if "keys" in wanted:
        got["keys"] = torch.cat([latent.unsqueeze(1).to(call.key.dtype), call.key[:, :1, :, nope:]], dim=-1)
    if "queries" in wanted:
        heads, dk = call.query.shape[1], call.query.shape[-1]
        up = mla.kv_b_proj.weight.view(heads, -1, latent.shape[-1])[:, :nope]  # (H, nope, r): W_UK per head
        absorbed = torch.einsum("bhtn,hnr->bhtr", call.query[..., :nope], up.to(call.query.dtype))
        scale = (call.scaling if call.scaling is not None else dk ** -0.5) * math.sqrt(latent.shape[-1] + dk - nope)
        got["queries"] = torch.cat([absorbed, call.query[..., nope:]], dim=-1) * scale
    return got


def _scaled(call: AttentionCall) -> torch.Tensor:
    """The query scaled so that the default softmax scale dk ** -0.5 gives the family's own."""
    dk = call.query.shape[-1]
    if call.scaling is None or math.isclose(call.scaling * math.sqrt(dk), 1.0, rel_tol=1e-9):
        return call.query
    return call.query * (call.scaling * math.sqrt(dk))


def _key(h: torch.Tensor) -> tuple:
    return h.data_ptr(), tuple(h.shape), tuple(h.stride())


def _handed(record: tuple, slot: int | str):
    """What a recorded layer call (hidden, args, kwargs) was handed at `slot` (a positional index or a keyword)."""
    return record[1][slot] if isinstance(slot, int) else record[2][slot]


def _cache_keyword(kwargs: dict) -> str:
    """The name under which the family's layers take their cache (transformers 5 renamed past_key_values)."""
    return "past_key_values" if "past_key_values" in kwargs else "cache"


class TransformersLM(nn.Module):
    """Embeddings and layers 1..n_layers of a checkpoint's own transformers model (layer n_layers up to its
    attention), with the interface the streaming prefill drives (see models/llama.py's TruncatedLM).
    `base`: the family's decoder model (e.g. LlamaModel) truncated at n_layers; `rules`: each layer's LayerRule.
    `rope(positions)` returns the positions themselves: each layer takes its own position embeddings from them."""

    fast = False

    def __init__(self, base: nn.Module, spec: ModelSpec, n_layers: int, rules: list[LayerRule],
                 inv_freq: torch.Tensor | None):
        super().__init__()
        self.base, self.spec, self.n_layers, self.rules = base, spec, n_layers, rules
        # a rotate-half RoPE's frequencies shared by every full-attention layer (DCA's moves), else None
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.rope_scaling = 1.0
        self.retaining_head: nn.Module | None = None
        self.layers_ = [TransformersLayer(self, i + 1, layer) for i, layer in enumerate(base.layers)]
        self._memo: tuple[torch.Tensor, int, list] | None = None
        self.token_inputs: list[TokenInput] = []
        self.latent_keys = True  # an MLA retrieval layer scored from its latent (models/transformers_loader.py)

    @property
    def residual_width(self) -> int:
        """The width of the stream between layers: the hidden size and the token inputs it carries."""
        return self.spec.hidden_size + sum(t.width for t in self.token_inputs)

    def find_token_inputs(self) -> None:
        """Find the layer inputs made from each token alone (`TokenInput`): floating (B, T, X) tensors a layer is
        handed that differ between two inputs of other ids at the same positions."""
        first, second = (self._record(input_ids=torch.tensor([ids], device=self.device)) for ids in ([1, 2], [3, 4]))
        found, start = [], self.spec.hidden_size
        for layer, ((_, args_a, kw_a), (_, args_b, kw_b)) in enumerate(zip(first, second), start=1):
            for slot in [*range(len(args_a)), *kw_a]:
                a, b = _handed((None, args_a, kw_a), slot), _handed((None, args_b, kw_b), slot)
                if (isinstance(a, torch.Tensor) and a.is_floating_point() and a.dim() == 3
                        and tuple(a.shape[:2]) == (1, 2) and not torch.equal(a, b)):
                    found.append(TokenInput(layer, slot, a.shape[-1], start))
                    start += a.shape[-1]
        self.token_inputs = found

    def with_token_inputs(self, layer: int, stream: torch.Tensor, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """args, kwargs of 1-based `layer` with its token inputs taken from `stream` (B, T, residual_width)."""
        args = list(args)
        for t in self.token_inputs:
            if t.layer == layer:
                part = stream[..., t.start: t.start + t.width]
                if isinstance(t.slot, int):
                    args[t.slot] = part
                else:
                    kwargs = {**kwargs, t.slot: part}
        return tuple(args), kwargs

    @property
    def device(self) -> torch.device:
        return self.base.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.base.get_input_embeddings().weight.dtype

    @property
    def plain(self) -> bool:
        """Whether every layer below l_R is full attention without sinks, with the spec's shapes: the cascade's
        candidate pass and the batched prefill then apply."""
        spec, moved = self.spec, self.inv_freq
        same_turn = lambda r: r.inv_freq is None or moved is None or torch.equal(r.inv_freq, moved)  # noqa: E731
        return all(r.plain and same_turn(r)
                   and (r.kv_heads, r.head_dim, r.v_dim) == (spec.num_kv_heads, spec.head_dim, spec.value_dim)
                   for r in self.rules[: self.n_layers - 1])

    def layer(self, index: int) -> TransformersLayer:
        """The index-th layer, counting from 1."""
        return self.layers_[index - 1]

    def attention_rule(self, index: int) -> LayerRule:
        """How the index-th layer (1-based) attends."""
        return self.rules[index - 1]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: (..., T) int64 -> (..., T, residual_width) what the family's forward hands its first layer (scaled
        embeddings where the family scales them) and the token inputs, in the model's dtype."""
        batched = ids if ids.dim() == 2 else ids.unsqueeze(0)
        records = self._record(input_ids=batched.to(self.device))
        hidden = records[0][0]
        if self.token_inputs:
            hidden = torch.cat([hidden] + [_handed(records[t.layer - 1], t.slot) for t in self.token_inputs], dim=-1)
        return hidden if ids.dim() == 2 else hidden[0]

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: (..., T) int64 -> (positions, positions): they stand in for cos and sin (each layer takes
        its own position embeddings: `layer_inputs`)."""
        return positions, positions

    def layer_inputs(self, positions: torch.Tensor, batch: int) -> list[tuple[tuple, dict]]:
        """The (args, kwargs) the family's forward hands each layer for tokens at `positions` ((T,), (B, T) or
        (B, 1, T)) besides the hidden states; memoised for the last positions asked."""
        pos = positions.reshape(-1, positions.shape[-1]).to(self.device)
        pos = pos.expand(batch, -1) if pos.shape[0] != batch else pos
        memo = self._memo
        if memo is not None and memo[1] == batch and memo[0].shape == pos.shape and torch.equal(memo[0], pos):
            return memo[2]
        ids = torch.zeros(batch, pos.shape[1], dtype=torch.int64, device=self.device)  # the token inputs: `embed`'s
        recorded = [(args, kwargs) for _, args, kwargs in self._record(input_ids=ids, position_ids=pos)]
        self._memo = (pos.clone(), batch, recorded)
        return recorded

    def _record(self, **inputs) -> list[tuple[torch.Tensor, tuple, dict]]:
        """Run the family's forward with every layer replaced by a recorder: (hidden, args, kwargs) per layer."""
        records: list = [None] * len(self.base.layers)

        def recorder(i: int):
            def forward(hidden_states, *args, **kwargs):
                records[i] = (hidden_states, args, kwargs)
                return hidden_states
            return forward

        for i, layer in enumerate(self.base.layers):
            layer.forward = recorder(i)
        try:
            self.base(**inputs, use_cache=False)
        finally:
            for layer in self.base.layers:
                del layer.forward
        return records

    def new_cache(self):
        """An empty transformers cache for the layers without attention (their recurrent and conv states)."""
        from transformers import DynamicCache

        return DynamicCache(config=self.base.config)


def copied_cache(cache):
    """A copy of a transformers cache that a query may advance and drop."""
    return copy.deepcopy(cache)
