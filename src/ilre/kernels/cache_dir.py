"""Where ilre keeps what it builds or converts once (compiled kernels, converted checkpoints, calibrations)."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def cache_root() -> Path:
    """$ILRE_CACHE_DIR, else ~/.cache/ilre."""
    return Path(os.environ.get("ILRE_CACHE_DIR") or Path.home() / ".cache" / "ilre")


@contextmanager
def built_folder(target: Path, replace: bool = False) -> Iterator[Path]:
    """A fresh folder beside `target` to build it in, renamed to `target` when the block ends (nothing is left
    where it fails). Where `target` exists by then: replaced when `replace`, else kept (another process built it
    first)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        yield tmp
        if replace:
            shutil.rmtree(target, ignore_errors=True)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first
            if not target.exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
