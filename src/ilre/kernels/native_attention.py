"""A C kernel for `chunk_attention` on the CPU (float32 / bfloat16), built with gcc on first use.

The source (native/chunk_attention.c) is compiled once per machine, compiler and source into the cache and loaded
with ctypes (kernels/native_build.py, which also says how it shares torch's OpenMP runtime). Float32 throughout,
except that bfloat16 inputs use the avx512_bf16 dot products where the CPU has them.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading

import torch

from .native_build import cpu_flags as _cpu_flags
from .native_build import load

logger = logging.getLogger(__name__)

_DTYPES = {torch.float32: 0, torch.bfloat16: 1}
PROFILER_NAME = "ilre::native_chunk_attention"

_lock = threading.Lock()
_fn: ctypes._CFuncPtr | None = None  # type: ignore[name-defined]
_fast = False  # built with AVX-512 or AVX2 and FMA (ilre_chunk_attention_fast)
_tried = False


def _load() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """The kernel's ctypes function, built and loaded on the first call; None when that failed."""
    global _fn, _fast, _tried, _failure
    if _tried:
        return _fn
    with _lock:
        if _tried:
            return _fn
        try:
            lib = load("chunk_attention")
            fn = lib.ilre_chunk_attention
            i64, ptr = ctypes.c_int64, ctypes.c_void_p
            fn.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64, i64, ptr, ptr, ctypes.c_int, ctypes.c_int]
            fn.restype = ctypes.c_int
            _fast = bool(lib.ilre_chunk_attention_fast())
            _fn = fn
        except Exception as exc:  # no compiler, failed build or load: the caller falls back to torch
            _failure = str(exc).splitlines()[0][:300]
            logger.warning("the C chunk-attention kernel is not built (%s): PyTorch's kernels run", _failure)
        _tried = True
    return _fn


_failure: str | None = None  # why the kernel could not be built or loaded


def failure() -> str | None:
    """Why the C kernel is not available (None where it is, or has not been tried)."""
    _load()
    return _failure


def available() -> bool:
    """Whether the C kernel could be built and loaded on this machine."""
    return _load() is not None


@functools.cache
def native_preferred(dtype: torch.dtype) -> bool:
    """Whether `chunk_attention` runs the C kernel for `dtype` on this CPU: where it was built with AVX-512 or with AVX2
    and FMA (x86-64-v3, as under ATEN_CPU_CAPABILITY=avx2; built for x86-64-v2 it runs 2-3x slower than PyTorch's),
    for float32, and for bfloat16 unless the CPU has AMX tiles (amx_bf16), on which PyTorch's flash kernel runs its
    products (bench/native_attention_bench.py measures both; without avx512_bf16, bfloat16 goes through float32)."""
    if not available() or not _fast:
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and " amx_bf16" not in _cpu_flags()


def native_chunk_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_prefix: int, visible: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """`chunk_attention` in C: q (heads, R, d); k, v (kv_heads, P + C, d) -> (heads, R, d).

    visible: (P,) bool, the prefix entries seen (None = all); rows: (R,) int64 ascending, the chunk
    rows q holds (None = all C). Returns None where the kernel does not apply (not a CPU tensor,
    a dtype other than float32/bfloat16, mixed dtypes, head size over 256, or no build).
    """
    code = _DTYPES.get(q.dtype)
    if code is None or k.dtype != q.dtype or v.dtype != q.dtype or q.device.type != "cpu":
        return None
    if k.device.type != "cpu" or v.device.type != "cpu" or q.shape[-1] > 256:
        return None
    fn = _fn if _tried else _load()
    if fn is None:
        return None
    heads, n_rows, dim = q.shape
    kv_heads, n_keys, _ = k.shape
    n_chunk = n_keys - n_prefix
    if v.shape != k.shape or k.shape[-1] != dim or (visible is not None and visible.numel() != n_prefix):
        raise ValueError(f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, n_prefix {n_prefix}")
    if rows is not None and rows.numel() != n_rows:
        raise ValueError(f"{rows.numel()} rows for q of {n_rows}")
    q = q if q.is_contiguous() else q.contiguous()
    k = k if k.is_contiguous() else k.contiguous()
    v = v if v.is_contiguous() else v.contiguous()
    if rows is None:
        if n_rows != n_chunk:
            raise ValueError(f"q has {n_rows} rows for a chunk of {n_chunk}")
        pos = torch.arange(n_chunk, dtype=torch.int64)
    else:
        pos = rows.to(device="cpu", dtype=torch.int64).contiguous()
    vis = None
    if visible is not None:
        vis = visible.to(device="cpu", dtype=torch.uint8).contiguous()
    out = torch.empty_like(q)
    with torch.profiler.record_function(PROFILER_NAME):  # its own row under the torch profiler (bench/prefill_profile.py)
        rc = fn(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), heads, kv_heads, n_rows, n_prefix, n_chunk,
            dim, None if vis is None else vis.data_ptr(), pos.data_ptr(), code, torch.get_num_threads(),
        )
    if rc != 0:
        return None
    return out

