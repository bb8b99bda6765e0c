"""Where ilre keeps what it builds or converts once (compiled kernels, converted checkpoints, calibrations)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$ILRE_CACHE_DIR, else ~/.cache/ilre."""
    return Path(os.environ.get("ILRE_CACHE_DIR") or Path.home() / ".cache" / "ilre")
