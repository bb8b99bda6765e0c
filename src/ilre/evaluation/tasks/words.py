"""The `wonderwords` package's word lists, as RULER reads them (the tasks' keys, values and CWE vocabulary)."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path


@functools.lru_cache(maxsize=None)
def wonderwords_list(name: str) -> tuple[str, ...]:
    """A word list of the `wonderwords` package (nounlist, adjectivelist, verblist), as RULER reads it."""
    spec = importlib.util.find_spec("wonderwords")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("ruler: the `wonderwords` package is not installed: pip install 'ilre[eval]' "
                                "(in a clone of the repository: make setup)")
    path = Path(spec.submodule_search_locations[0]) / "assets" / f"{name}.txt"
    return tuple(w.strip() for w in path.read_text(encoding="utf-8").splitlines() if w.strip())
