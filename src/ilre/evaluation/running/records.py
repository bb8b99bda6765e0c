"""The raw results of a run: one Record per sample x strategy in `<results_dir>/raw.jsonl`, and the wall time
`<results_dir>/meta.json` sums per placement; what the results page reads back."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Record:
    """One sample x strategy. retention in [0, 1]; e2e in [0, 1] or None when not generated."""

    task: str
    length: int
    index: int
    seed: int
    strategy: str
    budget: int
    context_tokens: int
    kept_tokens: int
    retention: float
    compress_s: float
    e2e: float | None = None
    prediction: str | None = None
    answers: list[str] = field(default_factory=list)
    layer: int | None = None
    dca: bool | None = None
    generate_s: float | None = None
    note: str | None = None
    whole_units: float | None = None  # of the units the kept tokens touch (sink aside), the share kept whole
    headed_rows: float | None = None  # of the table rows kept whole, the share kept with their header
    new_tokens: int | None = None  # the generation budget used
    dtype: str | None = None  # the compressor's dtype (None: float32, records from before dtypes)
    peak: float | None = None  # the cascade's peak strength over its candidates (compressor/strategies/cascade.py)
    coarse_peak: float | None = None  # and its coarse layer's over the whole context (what `coarse_below` reads)
    fell_back: bool | None = None  # whether the cascade read the whole context instead (None: not a cascade row)
    timing: str | None = None  # why compress_s is not this row's whole cost (None: it is)

    def key(self) -> tuple:
        return (self.task, self.length, self.index, self.seed, self.strategy, self.budget)


def load_records(path: Path) -> list[dict]:
    """The records of a raw.jsonl, in file order ([] when there is none)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_timing(meta: dict) -> dict[str, dict]:
    """meta.json's summed wall time per placement ("cpu bfloat16" -> {samples, seconds}); an older meta's
    single {samples, seconds} belongs to its recorded placement."""
    timing = meta.get("timing") or {}
    if "samples" in timing:
        return {meta.get("placement", "?"): dict(timing)}
    return {placement: dict(spent) for placement, spent in timing.items()}
