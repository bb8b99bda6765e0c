"""Llama-family decoder layers (Llama, Mistral, Qwen2, Qwen3) as the streaming prefill drives them.

Parameter names mirror the Hugging Face checkpoints under `model.` so weights load by name. A layer
exposes its steps separately (project q/k/v, finish with o_proj + MLP) because the prefill decides
which keys each chunk attends to, and the retrieval layer l_R only ever needs q and k.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.rope import apply_rope, rope_cos_sin
from .spec import ModelSpec


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension, computed in float32 as the reference does."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class Attention(nn.Module):
    """q/k/v/o projections; `full=False` builds only q and k (the retrieval layer)."""

    def __init__(self, spec: ModelSpec, full: bool):
        super().__init__()
        self.spec = spec
        d, hd = spec.hidden_size, spec.head_dim
        self.q_proj = nn.Linear(d, spec.num_heads * hd, bias=spec.qkv_bias)
        self.k_proj = nn.Linear(d, spec.num_kv_heads * hd, bias=spec.qkv_bias)
        if full:
            self.v_proj = nn.Linear(d, spec.num_kv_heads * hd, bias=spec.qkv_bias)
            self.o_proj = nn.Linear(spec.num_heads * hd, d, bias=spec.o_bias)
        if spec.qk_norm:
            self.q_norm = RMSNorm(hd, spec.rms_norm_eps)
            self.k_norm = RMSNorm(hd, spec.rms_norm_eps)

    def _heads(self, x: torch.Tensor, n_heads: int) -> torch.Tensor:
        return x.view(x.shape[0], n_heads, self.spec.head_dim).transpose(0, 1)  # (heads, T, d)

    def queries(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: (T, D) normed hidden states -> (heads, T, d) rotated queries."""
        q = self._heads(self.q_proj(x), self.spec.num_heads)
        if self.spec.qk_norm:
            q = self.q_norm(q)
        return apply_rope(q, cos, sin)

    def keys(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: (T, D) normed hidden states -> (kv_heads, T, d) rotated keys."""
        k = self._heads(self.k_proj(x), self.spec.num_kv_heads)
        if self.spec.qk_norm:
            k = self.k_norm(k)
        return apply_rope(k, cos, sin)

    def values(self, x: torch.Tensor) -> torch.Tensor:
        """x: (T, D) normed hidden states -> (kv_heads, T, d)."""
        return self._heads(self.v_proj(x), self.spec.num_kv_heads)


class MLP(nn.Module):
    """SwiGLU feed-forward."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        d, f = spec.hidden_size, spec.intermediate_size
        self.gate_proj = nn.Linear(d, f, bias=spec.mlp_bias)
        self.up_proj = nn.Linear(d, f, bias=spec.mlp_bias)
        self.down_proj = nn.Linear(f, d, bias=spec.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """One pre-norm decoder layer; `full=False` keeps only what the retrieval layer needs."""

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
        """h: (T, D) -> q (heads, T, d), k and v (kv_heads, T, d); q and k rotated."""
        x = self.input_layernorm(h)
        attn = self.self_attn
        return attn.queries(x, cos, sin), attn.keys(x, cos, sin), attn.values(x)

    def keys(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """h: (T, D) -> (kv_heads, T, d) rotated keys only."""
        return self.self_attn.keys(self.input_layernorm(h), cos, sin)

    def queries(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """h: (T, D) -> (heads, T, d) rotated queries only."""
        return self.self_attn.queries(self.input_layernorm(h), cos, sin)

    def finish(self, h: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """h: (T, D), attn_out: (heads, T, d) -> next layer's input (T, D)."""
        merged = attn_out.transpose(0, 1).reshape(h.shape[0], -1)  # (T, heads*d)
        h = h + self.self_attn.o_proj(merged)
        return h + self.mlp(self.post_attention_layernorm(h))


class TruncatedLM(nn.Module):
    """Embeddings, RoPE and layers 1..n_layers of a decoder; layer n_layers is q/k only.

    Layers are numbered from 1 as in the paper: `layer(l)` is the l-th decoder layer.
    """

    def __init__(self, spec: ModelSpec, n_layers: int, inv_freq: torch.Tensor, rope_scaling: float = 1.0):
        super().__init__()
        if not 1 <= n_layers <= spec.num_layers:
            raise ValueError(f"layer: must be in 1..{spec.num_layers} (got {n_layers})")
        self.spec = spec
        self.n_layers = n_layers
        self.rope_scaling = rope_scaling
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(spec, full=i < n_layers - 1) for i in range(n_layers)
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def layer(self, index: int) -> DecoderLayer:
        """The index-th decoder layer, counting from 1."""
        return self.layers[index - 1]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: (T,) int64 -> (T, D) hidden states."""
        return self.embed_tokens(ids)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: (T,) int64 -> cos, sin: (T, d) in the model's dtype."""
        cos, sin = rope_cos_sin(self.inv_freq, positions, self.rope_scaling)
        dtype = self.embed_tokens.weight.dtype
        return cos.to(dtype), sin.to(dtype)
