"""A decoder layer's elementwise passes in C, one pass over memory each (native/layer_passes.c): RMSNorm into the
matmuls' dtype, the residual sum with the next RMSNorm, SiLU(gate) * up, and RoPE of the stacked q/k/v product into
head-major q, k, v.

PyTorch runs each as a chain of operators, each a pass over memory with a fresh tensor (RMSNorm five, a residual sum
of a bfloat16 output two, SiLU * up two, RoPE three plus the rotated halves' temporaries). The C passes reproduce
that chain's roundings (bit for bit for RoPE and the SiLU product; the norm's row sum and SiLU's exp in float32's
last bits). Each function returns None where it does not apply (not a CPU tensor, another dtype or layout, a tensor
autograd records, no build, or turned off): the caller then runs PyTorch's operators. `ILRE_NATIVE_PASSES=0` in the
environment turns them off (the benches' baseline).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading

import torch

from .native_build import compile_flags, cpu_flags, fast_build, load

logger = logging.getLogger(__name__)

_DTYPES = {torch.float32: 0, torch.bfloat16: 1}
PROFILER_NAMES = {"norm": "ilre::native_rms_norm", "residual": "ilre::native_residual", "silu": "ilre::native_silu_mul",
                  "rope": "ilre::native_rope"}

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False
_silu_bf16 = False  # bfloat16's SiLU product in C (built with avx512_bf16; else PyTorch's is the faster)


def _load() -> ctypes.CDLL | None:
    """The built library (once per process); None where the build failed or is not faster than PyTorch's operators
    (an x86-64-v2 build)."""
    global _lib, _tried, _silu_bf16, _failure
    if _tried:
        return _lib
    with _lock:
        if not _tried:
            try:
                if not fast_build(compile_flags(), cpu_flags()):
                    _failure = "built for x86-64-v2 only, where PyTorch's operators are faster"
                else:
                    lib = load("layer_passes", ("-ffp-contract=off", "-fno-trapping-math"))
                    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
                    lib.ilre_rms_norm.argtypes = [ptr, ptr, ptr, i64, i64, ctypes.c_float, i32, i32]
                    lib.ilre_residual.argtypes = [ptr, ptr, ptr, ptr, ptr, i64, i64, ctypes.c_float, i32, i32]
                    lib.ilre_silu_mul.argtypes = [ptr, ptr, i64, i64, i32, i32]
                    lib.ilre_rope_heads.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64, i64, i32, i32]
                    for fn in (lib.ilre_rms_norm, lib.ilre_residual, lib.ilre_silu_mul, lib.ilre_rope_heads):
                        fn.restype = i32
                    _silu_bf16 = bool(lib.ilre_silu_mul_bf16_fast())
                    _lib = lib
            except Exception as exc:  # no compiler, failed build or load: PyTorch's operators run
                _failure = str(exc).splitlines()[0][:300]
                logger.warning("the C layer passes are not built (%s): PyTorch's operators run", _failure)
            _tried = True
    return _lib


_failure: str | None = None  # why the passes do not run


def failure() -> str | None:
    """Why the C passes do not run (None where they do): not built, or turned off by ILRE_NATIVE_PASSES=0."""
    if os.environ.get("ILRE_NATIVE_PASSES", "1") == "0":
        return "turned off (ILRE_NATIVE_PASSES=0)"
    _load()
    return _failure


def enabled() -> bool:
    """Whether the C passes run (built, and not turned off by ILRE_NATIVE_PASSES=0)."""
    return os.environ.get("ILRE_NATIVE_PASSES", "1") != "0" and _load() is not None


def _usable(*tensors: torch.Tensor) -> bool:
    """CPU tensors in row-major order, none of them on autograd's record (the C passes have no backward)."""
    graded = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    return not graded and all(t.device.type == "cpu" and t.is_contiguous() for t in tensors)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, dtype: torch.dtype) -> torch.Tensor | None:
    """x: (..., D) float32 -> (..., D) `dtype`: weight * (x / sqrt(mean(x^2) + eps)).to(dtype), weight (D,) of `dtype`
    or None (no product). None where the C pass does not apply."""
    code = _DTYPES.get(dtype)
    if code is None or x.dtype != torch.float32 or x.dim() == 0 or not _usable(x) or not enabled():
        return None
    if weight is not None and (weight.dtype != dtype or weight.shape != x.shape[-1:] or not _usable(weight)):
        return None
    out = torch.empty(x.shape, dtype=dtype)
    dim = x.shape[-1]
    with torch.profiler.record_function(PROFILER_NAMES["norm"]):
        _lib.ilre_rms_norm(x.data_ptr(), None if weight is None else weight.data_ptr(), out.data_ptr(),
                           x.numel() // max(dim, 1), dim, eps, code, torch.get_num_threads())
    return out


def residual(h: torch.Tensor, out: torch.Tensor, norm: tuple[torch.Tensor | None, float] | None = None
             ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """h: (..., D) float32, the residual stream; out: (..., D) a layer's output in the matmuls' dtype -> (h + out in
    float32, and where `norm` = (weight or None, eps) is given that sum normed as `rms_norm` into out's dtype, else
    None). None where the C pass does not apply."""
    code = _DTYPES.get(out.dtype)
    if code is None or h.dtype != torch.float32 or h.shape != out.shape or h.dim() == 0 or not enabled():
        return None
    weight, eps = norm if norm is not None else (None, 0.0)
    if not _usable(h, out) or (weight is not None and (weight.dtype != out.dtype or weight.shape != h.shape[-1:]
                                                               or not _usable(weight))):
        return None
    total = torch.empty_like(h)
    normed = torch.empty_like(out) if norm is not None else None
    dim = h.shape[-1]
    with torch.profiler.record_function(PROFILER_NAMES["residual"]):
        _lib.ilre_residual(h.data_ptr(), out.data_ptr(), total.data_ptr(),
                           None if weight is None else weight.data_ptr(), None if normed is None else normed.data_ptr(),
                           h.numel() // max(dim, 1), dim, eps, code, torch.get_num_threads())
    return total, normed


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor | None:
    """gate_up: (..., 2F), [gate | up] per row -> (..., F) silu(gate) * up in its dtype. None where the C pass does not
    apply (bfloat16 on a CPU without avx512_bf16, where PyTorch's two passes are the faster)."""
    code = _DTYPES.get(gate_up.dtype)
    if code is None or gate_up.dim() == 0 or gate_up.shape[-1] % 2 or not _usable(gate_up) or not enabled():
        return None
    if code == 1 and not _silu_bf16:
        return None
    width = gate_up.shape[-1] // 2
    out = torch.empty(*gate_up.shape[:-1], width, dtype=gate_up.dtype)
    with torch.profiler.record_function(PROFILER_NAMES["silu"]):
        _lib.ilre_silu_mul(gate_up.data_ptr(), out.data_ptr(), out.numel() // max(width, 1), width, code,
                           torch.get_num_threads())
    return out


def rope_heads(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, rotated: int) -> torch.Tensor | None:
    """x: (T, heads * d), a projection's heads side by side per token; cos, sin: (T, d) -> (heads, T, d) head-major,
    the first `rotated` heads rotated to their tokens' positions (kernels/rope.apply_rope) and the rest copied. None
    where the C pass does not apply (a batch, mixed dtypes, an odd d)."""
    code = _DTYPES.get(x.dtype)
    if code is None or x.dim() != 2 or cos.dtype != x.dtype or sin.dtype != x.dtype or not enabled():
        return None
    rows, width = x.shape
    d = width // heads
    if d * heads != width or d % 2 or cos.shape != (rows, d) or sin.shape != (rows, d):
        return None
    if not _usable(x, cos, sin):
        return None
    out = torch.empty(heads, rows, d, dtype=x.dtype)
    with torch.profiler.record_function(PROFILER_NAMES["rope"]):
        _lib.ilre_rope_heads(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), out.data_ptr(), rows, heads, rotated, d,
                             code, torch.get_num_threads())
    return out
