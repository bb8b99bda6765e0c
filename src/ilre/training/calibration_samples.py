"""Each calibration sample's hits, kept as it is measured, so that `ilre calibrate` stopped midway (a long grid at
64K tokens runs for many minutes a sample on a CPU) resumes where it stopped.

The samples of one calibration (model, placement, prefill settings and plan: its `header`) go to one JSON Lines
file in the cache, named by a hash of the header: a run with anything else different starts a file of its own.
A line cut short by a kill is measured again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..kernels.cache_dir import cache_root


class SampleLog:
    """Hits per sample key (grid label, length, digits, depth) -> {strategy or "candidates": [0/1 per layer or
    factor]}, read from and appended to `path` (default: the cache's calibration/<hash of header>.jsonl)."""

    def __init__(self, header: dict, path: Path | None = None):
        text = json.dumps(header, sort_keys=True)
        self.path = path or cache_root() / "calibration" / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.jsonl"
        self.done: dict[tuple, dict[str, list[float]]] = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines()[1:]:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # cut short by a kill: measured again
                    continue
                self.done[tuple(row["key"])] = row["hits"]
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(text + "\n")

    def get(self, key: tuple) -> dict[str, list[float]] | None:
        """The hits measured for `key` by an earlier run, None when not yet measured."""
        return self.done.get(key)

    def add(self, key: tuple, hits: dict[str, list[float]]) -> None:
        """Keep `key`'s hits (appended at once, one line)."""
        with self.path.open("a") as out:
            out.write(json.dumps({"key": list(key), "hits": hits}) + "\n")
        self.done[key] = hits
