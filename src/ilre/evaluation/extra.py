"""The evaluation's own dependencies, the `eval` extra (`pip install 'ilre[eval]'`; `make setup` installs
it): plots (matplotlib), RULER's word lists (wonderwords), the BM25 baseline (bm25s). The service does not
need them; the commands that do say which are missing."""

from __future__ import annotations

import importlib.util

EVAL_MODULES = ("matplotlib", "wonderwords", "bm25s")


class MissingExtra(ImportError):
    """An evaluation command ran without the `eval` extra."""


def require_eval_extra(command: str, modules: tuple[str, ...] = EVAL_MODULES) -> None:
    """Raise MissingExtra naming the extra and the missing modules when any of `modules` is not installed."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtra(f"{command}: needs the `eval` extra (missing: {', '.join(missing)}): "
                           "pip install 'ilre[eval]' (in a clone of the repository: make setup)")
