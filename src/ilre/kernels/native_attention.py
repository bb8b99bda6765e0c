"""A C kernel for `chunk_attention` on the CPU (float32 / bfloat16), built with gcc on first use.

The source (native/chunk_attention.c) is compiled once per machine, compiler and source into
`$ILRE_CACHE_DIR` (default ~/.cache/ilre) / kernels/<sha256>/ and loaded with ctypes. Float32
throughout, except that bfloat16 inputs use the avx512_bf16 dot products where the CPU has them.

OpenMP: torch's CPU wheel ships torch/lib/libgomp.so.1 (soname libgomp.so.1, symbol versions up to
GOMP_5.0); the system one (GCC 12) goes to GOMP_5.1. A kernel linked against the system copy and
loaded after torch still maps a single libgomp (the loader matches the soname to torch's copy),
but a GOMP_5.1-only symbol would then fail at load time. So the kernel is linked against torch's
copy by path (-l:libgomp.so.1 and an rpath to torch/lib): one runtime, one thread pool, and a
missing symbol shows at build time.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from .cache_dir import cache_root

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native") / "chunk_attention.c"
CFLAGS = ["-O3", "-fopenmp", "-fno-math-errno", "-shared", "-fPIC"]
# PyTorch's own cap on its kernels' instruction sets (ATEN_CPU_CAPABILITY, as the benches emulate a CPU without
# AVX-512) caps this kernel's too; otherwise it is built for this CPU.
MARCH = {"avx2": "-march=x86-64-v3", "default": "-march=x86-64-v2"}
_DTYPES = {torch.float32: 0, torch.bfloat16: 1}
PROFILER_NAME = "ilre::native_chunk_attention"

_lock = threading.Lock()
_fn: ctypes._CFuncPtr | None = None  # type: ignore[name-defined]
_fast = False  # built with AVX-512 or AVX2 and FMA (ilre_chunk_attention_fast)
_tried = False


def _torch_gomp_dir() -> Path | None:
    """torch/lib when it ships libgomp.so.1 (the CPU wheels), else None (use the compiler's own)."""
    lib = Path(torch.__file__).parent / "lib"
    return lib if (lib / "libgomp.so.1").exists() else None


def _compile_flags() -> list[str]:
    """CFLAGS and the target: this CPU, or the instruction set ATEN_CPU_CAPABILITY caps PyTorch at."""
    return [*CFLAGS, MARCH.get(os.environ.get("ATEN_CPU_CAPABILITY", "").lower(), "-march=native")]


def _link_flags() -> list[str]:
    lib = _torch_gomp_dir()
    if lib is None:
        return []
    return [f"-L{lib}", "-l:libgomp.so.1", f"-Wl,-rpath,{lib}"]


@functools.cache
def _cpu_flags() -> str:
    """The flags line of /proc/cpuinfo ("" where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def _build(gcc: str) -> Path:
    """Compiles the source into the cache (atomic rename; concurrent builders are harmless)."""
    source = SOURCE.read_text()
    compile_flags, link_flags = _compile_flags(), _link_flags()
    version = subprocess.run([gcc, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256("\0".join([source, " ".join(compile_flags + link_flags), version, _cpu_flags()]).encode())
    target = cache_root() / "kernels" / key.hexdigest() / "chunk_attention.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        cmd = [gcc, *compile_flags, "-o", tmp, str(SOURCE), *link_flags]  # libraries after the source
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _load() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """The kernel's ctypes function, built and loaded on the first call; None when that failed."""
    global _fn, _fast, _tried
    if _tried:
        return _fn
    with _lock:
        if _tried:
            return _fn
        try:
            gcc = os.environ.get("CC") or shutil.which("gcc")
            if gcc is None:
                raise RuntimeError("no gcc on PATH")
            lib = ctypes.CDLL(str(_build(gcc)))
            fn = lib.ilre_chunk_attention
            i64, ptr = ctypes.c_int64, ctypes.c_void_p
            fn.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64, i64, ptr, ptr, ctypes.c_int, ctypes.c_int]
            fn.restype = ctypes.c_int
            _fast = bool(lib.ilre_chunk_attention_fast())
            _fn = fn
        except Exception as exc:  # no compiler, failed build or load: the caller falls back to torch
            logger.debug("native chunk attention unavailable: %s", exc)
        _tried = True
    return _fn


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

