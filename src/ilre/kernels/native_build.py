"""Build a C kernel of kernels/native/ with gcc once per machine, compiler, flags and source, and load it.

The shared library goes to `$ILRE_CACHE_DIR` (default ~/.cache/ilre) / kernels/<sha256>/ and is loaded with ctypes.

OpenMP: torch's CPU wheel ships torch/lib/libgomp.so.1 (soname libgomp.so.1, symbol versions up to
GOMP_5.0); the system one (GCC 12) goes to GOMP_5.1. A kernel linked against the system copy and
loaded after torch still maps a single libgomp (the loader matches the soname to torch's copy),
but a GOMP_5.1-only symbol would then fail at load time. So kernels are linked against torch's
copy by path (-l:libgomp.so.1 and an rpath to torch/lib): one runtime, one thread pool, and a
missing symbol shows at build time.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from .cache_dir import cache_root

NATIVE_DIR = Path(__file__).with_name("native")
CFLAGS = ["-O3", "-fopenmp", "-fno-math-errno", "-shared", "-fPIC"]
# PyTorch's own cap on its kernels' instruction sets (ATEN_CPU_CAPABILITY, as the benches emulate a CPU without
# AVX-512) caps the kernels' too; otherwise they are built for this CPU.
MARCH = {"avx2": "-march=x86-64-v3", "default": "-march=x86-64-v2"}


def torch_gomp_dir() -> Path | None:
    """torch/lib when it ships libgomp.so.1 (the CPU wheels), else None (use the compiler's own)."""
    lib = Path(torch.__file__).parent / "lib"
    return lib if (lib / "libgomp.so.1").exists() else None


def compile_flags() -> list[str]:
    """CFLAGS and the target: this CPU, or the instruction set ATEN_CPU_CAPABILITY caps PyTorch at."""
    return [*CFLAGS, MARCH.get(os.environ.get("ATEN_CPU_CAPABILITY", "").lower(), "-march=native")]


def link_flags() -> list[str]:
    lib = torch_gomp_dir()
    if lib is None:
        return []
    return [f"-L{lib}", "-l:libgomp.so.1", f"-Wl,-rpath,{lib}"]


@functools.cache
def cpu_flags() -> str:
    """The flags line of /proc/cpuinfo ("" where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def fast_build(flags: list[str], cpu: str) -> bool:
    """Whether `flags` build for AVX-512, or for AVX2 and FMA (this CPU's, or x86-64-v3): not an x86-64-v2 build."""
    have = set(cpu.split())
    return ("-march=native" in flags and ("avx512f" in have or {"avx2", "fma"} <= have)) or "-march=x86-64-v3" in flags


def build(source: Path, gcc: str, extra: tuple[str, ...] = ()) -> Path:
    """Compiles `source` (with `extra` flags) into the cache and returns the library's path (atomic rename;
    concurrent builders are harmless)."""
    text = source.read_text()
    flags, links = [*compile_flags(), *extra], link_flags()
    version = subprocess.run([gcc, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256("\0".join([text, " ".join(flags + links), version, cpu_flags()]).encode())
    target = cache_root() / "kernels" / key.hexdigest() / source.with_suffix(".so").name
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        cmd = [gcc, *flags, "-o", tmp, str(source), *links]  # libraries after the source
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def compiler() -> str | None:
    """The C compiler kernels are built with: $CC, else gcc on PATH; None where there is none."""
    return os.environ.get("CC") or shutil.which("gcc")


def load(name: str, extra: tuple[str, ...] = ()) -> ctypes.CDLL:
    """kernels/native/`name`.c built (see `build`) and loaded; raises where there is no gcc or the build fails."""
    gcc = compiler()
    if gcc is None:
        raise RuntimeError("no C compiler: neither $CC nor gcc on PATH")
    return ctypes.CDLL(str(build(NATIVE_DIR / f"{name}.c", gcc, extra)))
