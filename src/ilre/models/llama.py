"""Llama-family decoder layers (Llama, Mistral, Qwen2, Qwen3) as the streaming prefill drives them.

Parameter names mirror the Hugging Face checkpoints under `model.` so weights load by name. A layer
exposes its steps separately (project q/k/v, finish with o_proj + MLP) because the prefill decides
which keys each chunk attends to, and the retrieval layer l_R only ever needs q and k.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import layer_passes
from ..kernels.rope import apply_rope, rope_cos_sin
from .spec import ModelSpec


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension, computed in float32 as the reference does;
    the output has the weight's dtype (the matmuls' input), whatever the residual stream's.
    `unit`: the weight is all ones (folded into the next matrix, models/int8.py): its product is skipped."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.unit = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = None if self.unit else self.weight
        out = layer_passes.rms_norm(x, weight, self.eps, self.weight.dtype)  # the same steps in one pass, or None
        if out is not None:
            return out
        normed = F.rms_norm(x.float(), x.shape[-1:], eps=self.eps).to(self.weight.dtype)
        return normed if weight is None else weight * normed


RETRIEVAL_PARTS = ("queries", "keys", "values", "raw_queries", "raw_keys")  # what the retrieval layer can give


class Attention(nn.Module):
    """q/k/v/o projections; `full=False` builds q, k and v only (the retrieval layer).

    The checkpoint's q_proj/k_proj/v_proj load by name; `fuse()` (called once after loading) stacks
    them into one (H*d + 2*KV*d, D) matrix, so a chunk takes one matmul instead of three.
    """

    def __init__(self, spec: ModelSpec, full: bool):
        super().__init__()
        self.spec = spec
        self.full = full
        d, hd = spec.hidden_size, spec.head_dim
        self.q_proj = nn.Linear(d, spec.num_heads * hd, bias=spec.qkv_bias)
        self.k_proj = nn.Linear(d, spec.num_kv_heads * hd, bias=spec.qkv_bias)
        self.v_proj = nn.Linear(d, spec.num_kv_heads * hd, bias=spec.qkv_bias)
        if full:
            self.o_proj = nn.Linear(spec.num_heads * hd, d, bias=spec.o_bias)
        if spec.qk_norm:
            self.q_norm = RMSNorm(hd, spec.rms_norm_eps)
            self.k_norm = RMSNorm(hd, spec.rms_norm_eps)

    def fuse(self) -> None:
        """Replace q_proj, k_proj and v_proj by one stacked projection `qkv_proj`."""
        names = ("q_proj", "k_proj", "v_proj")
        self.qkv_proj = _stack([getattr(self, name) for name in names])
        for name in names:
            delattr(self, name)

    def _rows(self, first: str, last: str) -> slice:
        """The rows of qkv_proj from block `first` through block `last` ("q", "k", "v", in that order)."""
        q_rows, kv_rows = self.spec.num_heads * self.spec.head_dim, self.spec.num_kv_heads * self.spec.head_dim
        starts = {"q": 0, "k": q_rows, "v": q_rows + kv_rows}
        ends = {"q": q_rows, "k": q_rows + kv_rows, "v": q_rows + 2 * kv_rows}
        return slice(starts[first], ends[last])

    def _project(self, x: torch.Tensor, part: str) -> torch.Tensor:
        """x: (T, D) -> (T, rows) for part "q", "k" or "qkv" (q|k|v side by side)."""
        rows, projection = self._rows(part[0], part[-1]), self.qkv_proj
        if not isinstance(projection, nn.Linear):
            return projection(x, rows)  # Int8Linear, PackedLinear (models/): the same rows of its product
        bias = projection.bias
        return F.linear(x, projection.weight[rows], None if bias is None else bias[rows])

    def parts(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, wanted: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """x: (T, D) normed hidden states -> the `wanted` RETRIEVAL_PARTS, in one matmul over the
        rows they need: queries (heads, T, d) and keys (kv_heads, T, d) rotated; raw_queries and
        raw_keys the same before RoPE (after q/k norms); values (kv_heads, T, d)."""
        blocks = sorted({part.removeprefix("raw_")[0] for part in wanted}, key="qkv".index)
        first, last = blocks[0], blocks[-1]
        projected = self._project(x, first + last)
        spec, n_heads = self.spec, {"q": self.spec.num_heads, "k": self.spec.num_kv_heads, "v": self.spec.num_kv_heads}
        out, at = {}, 0
        for block in "qkv"["qkv".index(first): "qkv".index(last) + 1]:
            width = n_heads[block] * spec.head_dim
            heads = self._heads(projected[..., at: at + width], n_heads[block])
            at += width
            if block == "v":
                out["values"] = heads
                continue
            norm = (self.q_norm if block == "q" else self.k_norm) if spec.qk_norm else None
            raw = norm(heads) if norm is not None else heads
            name = "queries" if block == "q" else "keys"
            if f"raw_{name}" in wanted:
                out[f"raw_{name}"] = raw
            if name in wanted:
                out[name] = apply_rope(raw, cos, sin)
        return {part: out[part] for part in wanted}

    def _heads(self, x: torch.Tensor, n_heads: int) -> torch.Tensor:
        """(..., T, heads*d) -> (..., heads, T, d); the leading dims are a batch, if any."""
        return x.view(*x.shape[:-1], n_heads, self.spec.head_dim).transpose(-3, -2)

    def _rotate_q(self, q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return apply_rope(self.q_norm(q) if self.spec.qk_norm else q, cos, sin)

    def _rotate_k(self, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return apply_rope(self.k_norm(k) if self.spec.qk_norm else k, cos, sin)

    def queries(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: (T, D) normed hidden states -> (heads, T, d) rotated queries."""
        return self.parts(x, cos, sin, ("queries",))["queries"]

    def keys(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: (T, D) normed hidden states -> (kv_heads, T, d) rotated keys."""
        return self.parts(x, cos, sin, ("keys",))["keys"]

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: (T, D) normed hidden states -> q (heads, T, d), k and v (kv_heads, T, d); q and k rotated."""
        n_q, n_kv = self.spec.num_heads, self.spec.num_kv_heads
        projected = self._project(x, "qkv")  # (..., T, (H + 2 KV) * d)
        if not self.spec.qk_norm:  # q and k rotated, v copied head-major, in one pass (kernels/layer_passes.py)
            done = layer_passes.rope_heads(projected, cos, sin, n_q + 2 * n_kv, n_q + n_kv)
            if done is not None:
                return done.split((n_q, n_kv, n_kv), dim=-3)
        heads = self._heads(projected, n_q + 2 * n_kv)  # (H + 2 KV, T, d)
        if self.spec.qk_norm:
            q, k, v = heads.split((n_q, n_kv, n_kv), dim=-3)
            return self._rotate_q(q, cos, sin), self._rotate_k(k, cos, sin), v
        q, k = apply_rope(heads[..., : n_q + n_kv, :, :], cos, sin).split((n_q, n_kv), dim=-3)  # one rotation
        return q, k, heads[..., n_q + n_kv :, :, :]


def _stack(linears: list[nn.Linear]) -> nn.Linear:
    """One Linear whose output rows are those of `linears`, in order."""
    weight = torch.cat([lin.weight for lin in linears], dim=0)
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=linears[0].bias is not None,
                      device=weight.device, dtype=weight.dtype)
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if fused.bias is not None:
        fused.bias = nn.Parameter(torch.cat([lin.bias for lin in linears]), requires_grad=False)
    return fused


class MLP(nn.Module):
    """SwiGLU feed-forward; `fuse()` stacks gate_proj and up_proj into one matmul."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        d, f = spec.hidden_size, spec.intermediate_size
        self.gate_proj = nn.Linear(d, f, bias=spec.mlp_bias)
        self.up_proj = nn.Linear(d, f, bias=spec.mlp_bias)
        self.down_proj = nn.Linear(f, d, bias=spec.mlp_bias)

    def fuse(self) -> None:
        """Replace gate_proj and up_proj by one stacked projection `gate_up_proj`."""
        self.gate_up_proj = _stack([self.gate_proj, self.up_proj])
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        act = layer_passes.silu_mul(gate_up)  # one pass (kernels/layer_passes.py), else PyTorch's two
        if act is None:
            gate, up = gate_up.chunk(2, dim=-1)  # views of one fresh product: SiLU in place
            act = torch.mul(F.silu(gate, inplace=True), up)
        return self.down_proj(act)


class DecoderLayer(nn.Module):
    """One pre-norm decoder layer; `full=False` keeps only what the retrieval layer needs (q, k, v)."""

    def __init__(self, spec: ModelSpec, full: bool = True):
        super().__init__()
        self.full = full
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = Attention(spec, full)
        if full:
            self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
            self.mlp = MLP(spec)

    def qkv(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h: (..., T, D) -> q (..., heads, T, d), k and v (..., kv_heads, T, d); q and k rotated
        with cos, sin: (..., T, d)."""
        return self.self_attn.qkv(self.input_layernorm(h), cos, sin)

    def drop(self, h: torch.Tensor) -> None:
        """A `qkv` of h whose `finish` will not come (nothing is held between the two here)."""

    def keys(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """h: (T, D) -> (kv_heads, T, d) rotated keys only."""
        return self.self_attn.keys(self.input_layernorm(h), cos, sin)

    def queries(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """h: (T, D) -> (heads, T, d) rotated queries only."""
        return self.self_attn.queries(self.input_layernorm(h), cos, sin)

    def parts(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, wanted: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """h: (T, D) -> the wanted RETRIEVAL_PARTS (see Attention.parts)."""
        return self.self_attn.parts(self.input_layernorm(h), cos, sin, wanted)

    def fuse(self) -> None:
        """Stack the projections that read the same input (see Attention.fuse, MLP.fuse)."""
        self.self_attn.fuse()
        if self.full:
            self.mlp.fuse()

    def finish(self, h: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """h: (..., T, D), attn_out: (..., heads, T, d) -> next layer's input (..., T, D)."""
        merged = attn_out.transpose(-3, -2).reshape(*h.shape[:-1], -1)  # (..., T, heads*d)
        out, norm = self.self_attn.o_proj(merged), self.post_attention_layernorm
        fused = None
        if out.dtype == norm.weight.dtype:  # the sum and its norm in one pass (kernels/layer_passes.py)
            fused = layer_passes.residual(h, out, (None if norm.unit else norm.weight, norm.eps))
        h, normed = fused if fused is not None else (_residual(h, out), None)
        return _residual(h, self.mlp(norm(h) if normed is None else normed))


def _residual(h: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """h + out, added into `out` (a layer's fresh output) when it has the residual stream's dtype and shape; a
    bfloat16 `out` in one pass where the C pass applies (kernels/layer_passes.py)."""
    if out.dtype == h.dtype and out.shape == h.shape:
        return out.add_(h)
    fused = layer_passes.residual(h, out)
    return h + out if fused is None else fused[0]


class TruncatedLM(nn.Module):
    """Embeddings, RoPE and layers 1..n_layers of a decoder; layer n_layers is q/k/v only.

    Layers are numbered from 1 as in the paper: `layer(l)` is the l-th decoder layer.
    `retaining_head`: Locret's head for layer n_layers (models/retaining_head.py), attached when one
    is stored for the model; the prefill's `retaining` part runs it.
    """

    def __init__(self, spec: ModelSpec, n_layers: int, inv_freq: torch.Tensor, rope_scaling: float = 1.0):
        super().__init__()
        if not 1 <= n_layers <= spec.num_layers:
            raise ValueError(f"layer: must be in 1..{spec.num_layers} (got {n_layers})")
        self.spec = spec
        self.n_layers = n_layers
        self.rope_scaling = rope_scaling
        # built on the meta device and assigned from the checkpoint (loader.load_truncated): no random init, which
        # on the meta device imports torch._dynamo (~3 s of every process start)
        weight = torch.empty(spec.vocab_size, spec.hidden_size)
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size, _weight=weight)
        self.layers = nn.ModuleList(
            DecoderLayer(spec, full=i < n_layers - 1) for i in range(n_layers)
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.retaining_head: nn.Module | None = None

    def fuse(self) -> "TruncatedLM":
        """Stack q/k/v and gate/up projections in every layer (once, after the weights are loaded)."""
        for layer in self.layers:
            layer.fuse()
        return self

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def residual_width(self) -> int:
        """The width of the stream between layers (the hidden size)."""
        return self.spec.hidden_size

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def layer(self, index: int) -> DecoderLayer:
        """The index-th decoder layer, counting from 1."""
        return self.layers[index - 1]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: (..., T) int64 -> (..., T, D) hidden states: the residual stream, float32 whatever the
        weights' dtype (bfloat16 layers add their outputs to it, so rounding does not accumulate)."""
        return self.embed_tokens(ids).float()

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: (T,) int64 -> cos, sin: (T, d) in the model's dtype."""
        cos, sin = rope_cos_sin(self.inv_freq, positions, self.rope_scaling)
        return cos.to(self.dtype), sin.to(self.dtype)
