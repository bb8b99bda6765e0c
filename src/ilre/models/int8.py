"""`--dtype int8`: the decoder's linear layers in int8 on CPUs (oneDNN), activations and attention in float32.

Per-token int8 activations lose too much where a few channels carry outliers, so the model is first
rotated, exactly (in float64, then stored in float32), as QuaRot does: the residual stream is multiplied
by an orthogonal Hadamard matrix Q (the embedding table by Q, every matrix reading the stream by Q, every
matrix writing to it by Q^T; RMSNorm's weights folded into the matrices after it, since the norm of hQ is
the norm of h), each value head and its columns of o_proj by a 64-wide Hadamard, and down_proj's input by
a block Hadamard applied on the fly. The rotated model computes the same function (`rotate` alone is
tested equal to the float32 model); only then are the matrices quantized: with a `Calibration`, by GPTQ
(models/gptq.py) against the rotated model's inputs on CALIBRATION_TEXT, computed once per model and kept in
the cache folder; without one, each weight to its nearest level. The query and key projections of the layers
whose attention is scored (`float_qkv`: the named layers and the cascade's coarse layer) stay float32.

`Int8Linear`: weights per output channel and activations per token, symmetric. Without VNNI, x86's int8
dot product adds pairs of u8 x s8 products in int16 and saturates; weights take 7 bits (|w| <= 63), so
255 x 63 x 2 stays within int16 and the kernel's sums are exact on every CPU: the same selections
whichever CPU runs them.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from .gptq import BLOCK, DAMPING, MATRICES, gptq, input_hessians
from .llama import TruncatedLM

log = logging.getLogger(__name__)

WEIGHT_LEVELS = 63  # 7 bits: no int16 saturation in AVX2's u8 x s8 pair sums (module docstring)
ACTIVATION_LEVELS = 127  # stored as uint8 around a zero point of 128
FLOAT_LAYERS = 1  # the first layers stay float32 (rotated): int8 there costs the most agreement (docs/benchmarks.md)
DOWN_BLOCK = 64  # the block Hadamard on down_proj's input, applied per token (or the largest dividing its width)
CALIBRATION_TEXT = Path(__file__).with_name("int8_calibration.txt")  # prose and code, none of the evaluation's texts
CALIBRATION_SEQUENCES, CALIBRATION_LENGTH = 4, 1024  # what GPTQ rounds against: 4 x 1024 tokens of it
ROUNDING_VERSION = 1  # part of the cache key: bump when the rounding changes
ENCODING_NAME = f"int8-gptq{ROUNDING_VERSION}"  # what encodings made by this rounding are kept under (not another's)


@dataclass(frozen=True)
class Calibration:
    """What GPTQ rounds against: token sequences (T_i,) int64 of CALIBRATION_TEXT, and where the rounded weights
    are kept (`cache_dir`, one file per model and calibration, whatever the truncation; `model_key` names the
    checkpoint)."""

    sequences: tuple[torch.Tensor, ...]
    cache_dir: Path | None = None
    model_key: str = "model"


def calibration_sequences(tokenize) -> tuple[torch.Tensor, ...]:
    """CALIBRATION_SEQUENCES sequences of CALIBRATION_LENGTH token ids from CALIBRATION_TEXT; `tokenize`:
    text -> list of ids (the model's tokenizer)."""
    ids = tokenize(CALIBRATION_TEXT.read_text())
    n = min(CALIBRATION_SEQUENCES, len(ids) // CALIBRATION_LENGTH)
    if n == 0:
        raise ValueError(f"dtype: int8's calibration text gives {len(ids)} tokens, fewer than {CALIBRATION_LENGTH}")
    return tuple(torch.tensor(ids[i * CALIBRATION_LENGTH:(i + 1) * CALIBRATION_LENGTH]) for i in range(n))


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

    def __init__(self, weight: torch.Tensor, rotate_input: torch.Tensor | None = None,
                 rounded: tuple[torch.Tensor, torch.Tensor] | None = None):
        """`rounded`: (qweight (N, K) int8, scale (N,)) already chosen for `weight` (GPTQ); None: to nearest."""
        super().__init__()
        weight = weight.detach().float()
        self.out_features, self.in_features = weight.shape
        if rounded is None:
            self.scale = (weight.abs().amax(1) / WEIGHT_LEVELS).clamp_min(1e-12)  # (N,)
            self.qweight = (weight / self.scale[:, None]).round_().to(torch.int8)  # (N, K)
        else:
            self.qweight, self.scale = rounded[0].to(torch.int8), rounded[1].float()
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
    levels = torch.div(x, scale).round_().to(torch.int8)  # -127..127
    return scale, levels.view(torch.uint8).bitwise_xor_(128)  # + 128 in two's complement: 6x faster than float's


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
    norm.unit = True


def quantize(model: TruncatedLM, calibration: Calibration | None = None, float_qkv: frozenset[int] = frozenset()
             ) -> TruncatedLM:
    """Rotate a float32 `model` and replace its linear layers by `Int8Linear` (in place); returns it.
    The first FLOAT_LAYERS layers, the retrieval layer and the q/k/v projection of the layers in `float_qkv`
    (numbered from 1: their keys and queries are scores) stay float32. down_proj's input is rotated per token by
    a DOWN_BLOCK-wide Hadamard H (its weight by H here). `calibration`: GPTQ's rounding (module docstring)."""
    if model.dtype != torch.float32:
        raise ValueError(f"dtype: int8 quantizes a float32 model (got {model.dtype})")
    rotate(model)
    block = hadamard(math.gcd(DOWN_BLOCK, model.spec.intermediate_size))
    layers = [i for i in range(FLOAT_LAYERS + 1, model.n_layers + 1) if model.layer(i).full]
    rounded = _rounded(model, calibration, layers, block) if calibration and layers else {}
    for index in layers:
        layer = model.layer(index)
        attn, mlp = layer.self_attn, layer.mlp
        for name, owner, attr in zip(MATRICES, (attn, attn, mlp, mlp), ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")):
            if name == "qkv" and index in float_qkv:
                continue
            weight, rotation = getattr(owner, attr).weight, block if name == "down" else None
            if rotation is not None:
                weight = rotated_columns(weight, rotation)
            setattr(owner, attr, Int8Linear(weight, rotation, rounded.get((index, name))))
    return model


def _rounded(model: TruncatedLM, calibration: Calibration, layers: list[int], block: torch.Tensor
             ) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """(layer, matrix) -> GPTQ's (qweight, scale) for every matrix of `layers` of the rotated float32 `model`.
    A layer's rounding depends only on the layers below it, so one cache file per model and calibration holds
    every layer rounded so far, whatever the truncation; the missing ones are computed (seconds each) and added."""
    digest = hashlib.sha256(repr((ROUNDING_VERSION, WEIGHT_LEVELS, DAMPING, BLOCK, DOWN_BLOCK)).encode())
    for ids in calibration.sequences:
        digest.update(ids.to(torch.int64).numpy().tobytes())
    path = None if calibration.cache_dir is None else \
        calibration.cache_dir / f"{calibration.model_key}-{digest.hexdigest()[:16]}.safetensors"
    stored = load_file(path) if path is not None and path.is_file() else {}
    missing = [index for index in layers if f"{index}.down.qweight" not in stored]
    if missing:
        stored.update(_gptq_layers(model, calibration, missing, block))
        if path is not None:
            _store(path, stored)
    return {(index, name): (stored[f"{index}.{name}.qweight"], stored[f"{index}.{name}.scale"])
            for index in layers for name in MATRICES}


def _store(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Write the rounding whole or not at all (several processes may round at once); a cache folder that cannot
    be written costs the rounding at every start, not the start."""
    partial = path.with_suffix(f".{os.getpid()}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, str(partial))
        partial.replace(path)
    except OSError as exc:
        log.warning("int8: could not keep the rounding in %s (%s): it will be computed again at the next start",
                    path.parent, exc)


def _gptq_layers(model: TruncatedLM, calibration: Calibration, layers: list[int], block: torch.Tensor
                 ) -> dict[str, torch.Tensor]:
    """"{layer}.{matrix}.qweight" and ".scale" of every matrix of `layers` (ascending), by GPTQ."""
    start = time.perf_counter()
    hessians = input_hessians(model, list(calibration.sequences), range(layers[0], layers[-1] + 1))
    spread = torch.block_diag(*[block.double()] * (model.spec.intermediate_size // block.shape[0]))
    out = {}
    for index in layers:
        layer = model.layer(index)
        weights = (layer.self_attn.qkv_proj.weight, layer.self_attn.o_proj.weight, layer.mlp.gate_up_proj.weight,
                   rotated_columns(layer.mlp.down_proj.weight, block))
        for name, weight in zip(MATRICES, weights):
            hessian = hessians[index, name]
            if name == "down":  # its input is rotated by the block Hadamard: X H, so H^T (X^T X) H
                hessian = spread.T @ hessian @ spread
            out[f"{index}.{name}.qweight"], out[f"{index}.{name}.scale"] = gptq(weight, hessian, WEIGHT_LEVELS)
    log.info("int8: rounded %d layers by GPTQ over %d calibration tokens in %.1f s (once per model)", len(layers),
             sum(ids.numel() for ids in calibration.sequences), time.perf_counter() - start)
    return out


def rotated_columns(weight: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """weight (N, K) -> weight @ blockdiag(block, ..., block), in float64, as float32 (K a multiple of its size)."""
    b = block.shape[0]
    return (weight.double().view(weight.shape[0], -1, b) @ block).reshape(weight.shape).float()
