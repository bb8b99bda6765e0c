"""Attention of one prefill chunk over [sink | sliding window | itself] (the Λ mask, streamed)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .native_attention import native_chunk_attention, native_preferred

# The CPU flash kernel that returns each row's log-sum-exp: lets the prefix (dense) and the chunk
# (causal) be two unmasked calls merged exactly, instead of one call over a materialised mask.
_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def chunk_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_prefix: int, visible: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """One chunk of the streaming chunked prefill (arguments and result as `torch_chunk_attention`'s).

    On the CPU, the C kernel (kernels/native_attention.py) where it builds for AVX2 or AVX-512 and is the faster of
    the two for the dtype (`native_preferred`: float32, and bfloat16 where the CPU has no AMX tiles, which PyTorch's
    kernel runs its products on); elsewhere, and where it does not apply, PyTorch's kernels (`torch_chunk_attention`)."""
    if q.device.type == "cpu" and native_preferred(q.dtype):
        out = native_chunk_attention(q, k, v, n_prefix, visible, rows)
        if out is not None:
            return out
    return torch_chunk_attention(q, k, v, n_prefix, visible, rows)


def torch_chunk_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_prefix: int, visible: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """One chunk of the streaming chunked prefill, with PyTorch's attention kernels.

    q: (heads, C, d) queries of the chunk; k, v: (kv_heads, P + C, d) with the P = `n_prefix`
    cached sink + window entries first, then the chunk's own. Every query sees the chunk causally
    and the prefix entries where `visible` (P,) bool is True (None = all of them). heads must be a
    multiple of kv_heads (GQA: head h reads kv head h // group). Returns (heads, C, d). rows: (R,) int64
    ascending, where q holds only those rows of the chunk (heads, R, d), each seeing the chunk up to itself
    (a candidate pass that reads the other rows' K/V: compressor/candidate_prefill.py); returns (heads, R, d).
    With the whole prefix visible no mask is built: on the CPU, prefix and chunk are two flash calls
    merged by their log-sum-exp; elsewhere a lower-right causal bias lets the kernel skip the mask.
    Memory: one (heads, C, P + C) block at most, never the whole context.
    """
    n_chunk = k.shape[1] - n_prefix
    q4, k4, v4 = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    whole = rows is None
    if whole and visible is None and n_prefix == 0:
        return F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, enable_gqa=True).squeeze(0)
    if whole and visible is None and q.device.type == "cpu" and _CPU_FLASH is not None:
        out_p, lse_p = _CPU_FLASH(q4, k4[:, :, :n_prefix], v4[:, :, :n_prefix], 0.0, False)
        out_c, lse_c = _CPU_FLASH(q4, k4[:, :, n_prefix:], v4[:, :, n_prefix:], 0.0, True)
        weight_p = torch.sigmoid(lse_p - lse_c).unsqueeze(-1)  # share of the prefix in each row's softmax
        return torch.lerp(out_c.float(), out_p.float(), weight_p).to(q.dtype).squeeze(0)
    if whole and visible is None:
        from torch.nn.attention.bias import causal_lower_right  # imports torch._dynamo (~3 s): off the CPU path

        bias = causal_lower_right(n_chunk, n_prefix + n_chunk)
        return F.scaled_dot_product_attention(q4, k4, v4, attn_mask=bias, enable_gqa=True).squeeze(0)
    rows = torch.arange(n_chunk, device=q.device) if rows is None else rows
    causal = torch.arange(n_chunk, device=q.device).unsqueeze(0) <= rows.unsqueeze(1)  # (R, C)
    seen = torch.ones(n_prefix, dtype=torch.bool, device=q.device) if visible is None else visible
    mask = torch.cat((seen.expand(rows.numel(), n_prefix), causal), dim=1)  # (R, P + C)
    return F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, enable_gqa=True).squeeze(0)
