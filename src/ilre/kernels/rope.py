"""Rotary position embeddings (RoPE) and re-rotation of already rotated keys."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(..., d) -> (..., d): [x1, x2] -> [-x2, x1] (the half-split RoPE convention of Llama/Qwen)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(
    inv_freq: torch.Tensor, positions: torch.Tensor, scaling: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cos/sin tables for integer positions.

    inv_freq: (d/2,) float32; positions: (..., T) int64 (may be negative: re-rotation backwards).
    Returns cos, sin: (..., T, d) float32, multiplied by `scaling` (YaRN-style attention scaling).
    Computed in float32 exactly as transformers does, so keys match it bit for bit in spirit.
    """
    freqs = positions.to(torch.float32)[..., None] * inv_freq.to(torch.float32)  # (..., T, d/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (..., T, d)
    return emb.cos() * scaling, emb.sin() * scaling


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (heads, T, d); cos, sin: (T, d) -> (heads, T, d) rotated to each token's position.

    x * cos + rotate_half(x) * sin, the same roundings (a product, then a sum), in about half the passes over
    memory: each half's sin term is added into the cos product in place, with no rotated copy of x."""
    half = x.shape[-1] // 2
    out = torch.mul(x, cos)
    out[..., :half] -= x[..., half:] * sin[..., :half]
    out[..., half:] += x[..., :half] * sin[..., half:]
    return out


def rerotate(k: torch.Tensor, inv_freq: torch.Tensor, shift: int) -> torch.Tensor:
    """Move post-RoPE keys by `shift` positions: R(shift) R(p) k = R(p + shift) k.

    k: (kv_heads, T, d), already rotated to positions p; returns keys as if rotated to p + shift.
    Uses unscaled tables so magnitudes are untouched (the scaling was applied once already).
    """
    if shift == 0:
        return k
    cos, sin = rope_cos_sin(inv_freq, torch.tensor([shift], device=k.device))
    return apply_rope(k, cos.to(k.dtype), sin.to(k.dtype))


def rerotate_into(out: torch.Tensor, k: torch.Tensor, inv_freq: torch.Tensor, shift: int) -> torch.Tensor:
    """`rerotate(k, inv_freq, shift)` written into `out` (the shape of k), with no temporaries the size of k:
    three passes over it instead of rerotate's seven, for keys moved in bulk (DCA's score_keys)."""
    cos, sin = rope_cos_sin(inv_freq, torch.tensor([shift], device=k.device))
    cos, sin = cos.to(k.dtype), sin.to(k.dtype)  # (1, d)
    half = k.shape[-1] // 2
    torch.mul(k, cos, out=out)
    out[..., :half].addcmul_(k[..., half:], sin[..., :half], value=-1)
    out[..., half:].addcmul_(k[..., :half], sin[..., half:])
    return out


@dataclass(frozen=True)
class MovedKeys:
    """Context keys as a query reads them under DCA (eq. 7): `keys` (kv_heads, L, d) as encoded, and `spans`,
    ranges (start, end, shift) whose keys are read moved by `shift` positions (R(shift) k); the rest as they are.
    RoPE's rotations are orthogonal, so q . R(s) k = R(-s) q . k: scores move the query, once per span, instead of
    copying the keys (kernels/query_scores.py). `moved()` makes the copy, for what reads the keys themselves."""

    keys: torch.Tensor
    spans: tuple[tuple[int, int, int], ...]
    inv_freq: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.keys.shape

    @property
    def device(self) -> torch.device:
        return self.keys.device

    def moved(self) -> torch.Tensor:
        """The keys moved: (kv_heads, L, d), a new tensor."""
        out = self.keys.clone()
        for start, end, shift in self.spans:
            rerotate_into(out[:, start:end], self.keys[:, start:end], self.inv_freq, shift)
        return out


def keys_as_read(keys: torch.Tensor | MovedKeys) -> torch.Tensor:
    """The keys a query reads (kv_heads, L, d): MovedKeys moved, a tensor as it is."""
    return keys.moved() if isinstance(keys, MovedKeys) else keys
