"""GPTQ (Frantar et al., 2022) for `--dtype int8`'s 7-bit weights (models/int8.py).

Rounding each weight to its nearest level leaves every error where it falls. GPTQ rounds a matrix W (N, K)
column by column and moves each column's rounding error onto the columns not yet rounded, weighted so that the
product on typical inputs moves least: with H = X^T X over the inputs X (T, K) the matrix sees on a calibration
text and U the upper Cholesky factor of H^-1,

    q_i = round(w_i / s) * s,    w_j -= (w_i - q_i) / U_ii * U_ij   for every j > i   (per output row, scale s)

taking the columns in order of decreasing H_ii ("act order"). `gptq` applies the updates of BLOCK columns at
once (the paper's lazy batch updates); `gptq_reference` is the literal loop it is tested against.

`input_hessians` runs the float model densely (causal attention over each calibration sequence) in float64, so the
rounding decisions, and hence the int8 model, do not depend on the CPU's float32 kernels.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from .llama import TruncatedLM

DAMPING = 0.01  # added to H's diagonal, times its mean: H stays invertible where inputs are rare
BLOCK = 128  # columns rounded before their error reaches the rest (lazy batch updates)
MATRICES = ("qkv", "o", "gate_up", "down")  # a full layer's linear layers, by the input each reads


def row_scales(weight: torch.Tensor, levels: int) -> torch.Tensor:
    """weight (N, K) -> (N,) float64: one symmetric scale per output row, max |w| / levels (round to nearest's)."""
    return (weight.double().abs().amax(1) / levels).clamp_min(1e-12)


def _prepared(weight: torch.Tensor, hessian: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The weight (N, K) float64 and U (K, K) in act order, and that order (K,)."""
    w, h = weight.double().clone(), hessian.double().clone()
    dead = torch.diagonal(h) == 0  # inputs never seen: nothing to preserve there
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    order = torch.argsort(torch.diagonal(h), descending=True, stable=True)
    w, h = w[:, order], h[order][:, order]
    h += DAMPING * torch.diagonal(h).mean() * torch.eye(h.shape[0], dtype=h.dtype)
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    return w, u, order


@torch.no_grad()
def gptq(weight: torch.Tensor, hessian: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """weight (N, K), hessian (K, K) -> qweight (N, K) int8 in -levels..levels and scale (N,) float32, so that
    weight ~ qweight * scale[:, None] on the calibration inputs. Scales as `row_scales` of the original weight."""
    scale = row_scales(weight, levels)
    w, u, order = _prepared(weight, hessian)
    n_cols = w.shape[1]
    q = torch.empty_like(w)
    for a in range(0, n_cols, BLOCK):
        b = min(a + BLOCK, n_cols)
        block, errors = w[:, a:b].clone(), torch.empty(w.shape[0], b - a, dtype=w.dtype)
        for i in range(b - a):
            q[:, a + i] = torch.clamp(torch.round(block[:, i] / scale), -levels, levels)
            errors[:, i] = (block[:, i] - q[:, a + i] * scale) / u[a + i, a + i]
            block[:, i:] -= errors[:, i:i + 1] * u[a + i, a + i:b]
        w[:, b:] -= errors @ u[a:b, b:]
    return q[:, torch.argsort(order)].to(torch.int8), scale.float()


@torch.no_grad()
def gptq_reference(weight: torch.Tensor, hessian: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's algorithm as a literal loop (no blocks): for tests of `gptq`."""
    scale = row_scales(weight, levels)
    w, u, order = _prepared(weight, hessian)
    q = torch.empty_like(w)
    for i in range(w.shape[1]):
        q[:, i] = torch.clamp(torch.round(w[:, i] / scale), -levels, levels)
        error = (w[:, i] - q[:, i] * scale) / u[i, i]
        w[:, i + 1:] -= error[:, None] * u[i, i + 1:][None, :]
    return q[:, torch.argsort(order)].to(torch.int8), scale.float()


@torch.no_grad()
def input_hessians(model: TruncatedLM, sequences: list[torch.Tensor], layers: range) -> dict[tuple[int, str], torch.Tensor]:
    """(layer, matrix) -> X^T X (K, K) float64 over the inputs of that matrix (MATRICES) in `layers` (numbered
    from 1, full layers only), from a dense causal forward of each sequence (T_i,) int64 through the float model
    in float64. down_proj's X is its input as the float model computes it (before any rotation of models/int8)."""
    spec, out = model.spec, {}
    states = [model.embed(ids).double() for ids in sequences]  # (T_i, D) each
    ropes = [tuple(t.double() for t in model.rope(torch.arange(ids.numel()))) for ids in sequences]
    group = spec.num_heads // spec.num_kv_heads

    def add(key: tuple[int, str], x: torch.Tensor) -> None:
        out[key] = out.get(key, 0) + x.T @ x

    for index in range(1, layers.stop):
        layer = copy.deepcopy(model.layer(index)).double()
        for n, (h, (cos, sin)) in enumerate(zip(states, ropes)):
            x = layer.input_layernorm(h)
            q, k, v = layer.self_attn.qkv(x, cos, sin)  # (H, T, d), (KV, T, d), (KV, T, d)
            attended = F.scaled_dot_product_attention(q, k.repeat_interleave(group, 0), v.repeat_interleave(group, 0),
                                                      is_causal=True)
            merged = attended.transpose(0, 1).reshape(h.shape[0], -1)  # (T, H*d)
            h = h + layer.self_attn.o_proj(merged)
            normed = layer.post_attention_layernorm(h)
            gate, up = layer.mlp.gate_up_proj(normed).chunk(2, dim=-1)
            hidden = F.silu(gate) * up
            if index in layers:
                for name, x_in in zip(MATRICES, (x, merged, normed, hidden)):
                    add((index, name), x_in)
            states[n] = h + layer.mlp.down_proj(hidden)
        del layer
    return out
