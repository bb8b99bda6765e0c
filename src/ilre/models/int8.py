"""`--dtype int8`: the decoder's linear layers in int8 on CPUs (oneDNN), activations and attention in float32.

Per-token int8 activations lose too much where a few channels carry outliers, so the model is first
rotated, exactly (in float64, then stored in float32), as QuaRot does: the residual stream is multiplied
by an orthogonal Hadamard matrix Q (the embedding table by Q, every matrix reading the stream by Q, every
matrix writing to it by Q^T; RMSNorm's weights folded into the matrices after it, since the norm of hQ is
the norm of h), each value head and its columns of o_proj by a 64-wide Hadamard, and down_proj's input by
a block Hadamard applied on the fly. The rotated model computes the same function (`rotate` alone is
tested equal to the float32 model); only then are the matrices quantized.

`Int8Linear`: weights per output channel and activations per token, symmetric. Without VNNI, x86's int8
dot product adds pairs of u8 x s8 products in int16 and saturates; weights take 7 bits (|w| <= 63), so
255 x 63 x 2 stays within int16 and the kernel's sums are exact on every CPU: the same selections
whichever CPU runs them.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .llama import TruncatedLM

WEIGHT_LEVELS = 63  # 7 bits: no int16 saturation in AVX2's u8 x s8 pair sums (module docstring)
ACTIVATION_LEVELS = 127  # stored as uint8 around a zero point of 128
FLOAT_LAYERS = 1  # the first layers stay float32 (rotated): int8 there costs the most agreement (docs/benchmarks.md)
DOWN_BLOCK = 64  # the block Hadamard on down_proj's input, applied per token (or the largest dividing its width)


def int8_available() -> bool:
    """True when this torch build has oneDNN's int8 linear (x86 CPUs)."""
    return hasattr(torch.ops.onednn, "qlinear_pointwise") and torch.backends.mkldnn.is_available()


def hadamard(n: int) -> torch.Tensor:
    """An orthonormal (n, n) float64 Hadamard matrix: n = 2^a * 12^b (Sylvester, Paley's 12); else a
    fixed random orthogonal matrix (what QuaRot falls back to)."""
    twelves = next((b for b in range(4) if n % 12 ** b == 0 and (n // 12 ** b) & (n // 12 ** b - 1) == 0), None)
    if twelves is None:
        generator = torch.Generator().manual_seed(n)
        q, r = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64))
        return q * torch.sign(torch.diagonal(r))
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n // 12 ** twelves:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    for _ in range(twelves):
        h = torch.kron(h, _paley12())
    return h / math.sqrt(n)


def _paley12() -> torch.Tensor:
    """Paley's construction for q = 11: a (12, 12) Hadamard matrix of +-1."""
    q = 11
    squares = {i * i % q for i in range(1, q)}
    chi = torch.tensor([0.0] + [1.0 if a in squares else -1.0 for a in range(1, q)], dtype=torch.float64)
    jacobsthal = chi[(torch.arange(q)[None, :] - torch.arange(q)[:, None]) % q]
    s = torch.zeros(12, 12, dtype=torch.float64)
    s[0, 1:], s[1:, 0], s[1:, 1:] = 1.0, -1.0, jacobsthal
    return torch.eye(12, dtype=torch.float64) + s


class Int8Linear(nn.Module):
    """y = x W^T with W (N, K) int8 per output channel and x int8 per token; `rotate_input`: a (b, b)
    matrix applied to each b-wide block of x first (W multiplied by it beforehand: `rotated_columns`)."""

    def __init__(self, weight: torch.Tensor, rotate_input: torch.Tensor | None = None):
        super().__init__()
        weight = weight.detach().float()
        self.out_features, self.in_features = weight.shape
        self.scale = (weight.abs().amax(1) / WEIGHT_LEVELS).clamp_min(1e-12)  # (N,)
        self.qweight = (weight / self.scale[:, None]).round_().to(torch.int8)  # (N, K)
        self.rotate_input = None if rotate_input is None else rotate_input.float()
        self._packed: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def _rows(self, rows: slice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """oneDNN's packed weight, scales and zero points for output rows `rows` (packed on first use)."""
        start, stop, _ = rows.indices(self.out_features)
        if (start, stop) not in self._packed:
            qweight = self.qweight[start:stop].contiguous()
            self._packed[start, stop] = (torch.ops.onednn.qlinear_prepack(qweight, None),
                                         self.scale[start:stop].contiguous(),
                                         torch.zeros(stop - start, dtype=torch.int32))
        return self._packed[start, stop]

    def forward(self, x: torch.Tensor, rows: slice = slice(None)) -> torch.Tensor:
        """x: (..., K) float32 -> (..., rows) float32: output rows `rows` of the full product."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1]).float()
        if self.rotate_input is not None:  # (T*K/b, b) @ (b, b)
            block = self.rotate_input.shape[0]
            flat = (flat.reshape(-1, block) @ self.rotate_input).reshape(flat.shape)
        scale, quantized = quantize_tokens(flat)
        packed, w_scale, w_zero = self._rows(rows)
        y = torch.ops.onednn.qlinear_pointwise(quantized, 1.0, 128, packed, w_scale, w_zero, None, 1.0, 0,
                                               torch.float32, "none", [], "")
        return y.mul_(scale).reshape(*shape[:-1], -1)


def quantize_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: (T, K) float32 -> scale (T, 1), x / scale rounded to -127..127 and stored + 128 as uint8 (T, K)."""
    scale = x.abs().amax(-1, keepdim=True).div_(ACTIVATION_LEVELS).clamp_min_(1e-12)
    return scale, torch.div(x, scale).round_().add_(128).to(torch.uint8)


def rotate(model: TruncatedLM) -> TruncatedLM:
    """Rotate `model` in place into the same function: the residual stream by a Hadamard Q, each value head
    by a head_dim-wide one (module docstring); float64 arithmetic, stored in the model's dtype. No biases."""
    spec = model.spec
    if spec.qkv_bias or spec.o_bias or spec.mlp_bias:
        raise ValueError("dtype: int8 needs a model without linear biases")
    q, head = hadamard(spec.hidden_size), hadamard(spec.head_dim)
    embed = model.embed_tokens.weight
    embed.data = (embed.data.double() @ q).to(embed.dtype)
    for layer in model.layers:
        attn = layer.self_attn
        _fold_norm(layer.input_layernorm, attn.qkv_proj, q)
        if not layer.full:
            continue
        weight = attn.qkv_proj.weight.data.double()
        values = weight[spec.num_heads * spec.head_dim + spec.num_kv_heads * spec.head_dim:]  # (KV*d, D), a view
        values.copy_((head.T @ values.view(spec.num_kv_heads, spec.head_dim, -1)).reshape(values.shape))
        attn.qkv_proj.weight.data = weight.to(embed.dtype)
        o = attn.o_proj.weight.data.double()  # (D, H*d): each head's columns by the same rotation
        o = (o.view(o.shape[0], spec.num_heads, spec.head_dim) @ head).reshape(o.shape)
        attn.o_proj.weight.data = (q.T @ o).to(embed.dtype)
        _fold_norm(layer.post_attention_layernorm, layer.mlp.gate_up_proj, q)
        down = layer.mlp.down_proj.weight
        down.data = (q.T @ down.data.double()).to(embed.dtype)
    return model


def _fold_norm(norm: nn.Module, linear: nn.Linear, q: torch.Tensor) -> None:
    """linear <- linear * norm's weight, rotated by q on its input; norm's weight <- 1."""
    weight = linear.weight.data.double() * norm.weight.data.double()
    linear.weight.data = (weight @ q).to(linear.weight.dtype)
    norm.weight.data.fill_(1.0)


def quantize(model: TruncatedLM) -> TruncatedLM:
    """Rotate a float32 `model` and replace its linear layers by `Int8Linear` (in place); returns it.
    The first FLOAT_LAYERS layers and the retrieval layer (its keys and queries are the scores) stay float32.
    down_proj's input is rotated per token by a DOWN_BLOCK-wide Hadamard H (its weight by H here)."""
    if model.dtype != torch.float32:
        raise ValueError(f"dtype: int8 quantizes a float32 model (got {model.dtype})")
    rotate(model)
    block = hadamard(math.gcd(DOWN_BLOCK, model.spec.intermediate_size))
    for layer in model.layers[FLOAT_LAYERS:]:
        if not layer.full:
            continue
        attn = layer.self_attn
        attn.qkv_proj = Int8Linear(attn.qkv_proj.weight)
        attn.o_proj = Int8Linear(attn.o_proj.weight)
        layer.mlp.gate_up_proj = Int8Linear(layer.mlp.gate_up_proj.weight)
        layer.mlp.down_proj = Int8Linear(rotated_columns(layer.mlp.down_proj.weight, block), rotate_input=block)
    return model


def rotated_columns(weight: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """weight (N, K) -> weight @ blockdiag(block, ..., block), in float64, as float32 (K a multiple of its size)."""
    b = block.shape[0]
    return (weight.double().view(weight.shape[0], -1, b) @ block).reshape(weight.shape).float()
