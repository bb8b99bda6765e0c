"""Passkeys in Python's reference documentation, measured: the default beyond the suite's own haystacks.

Each sample: a haystack of Python's `pydoc_data` topics (text no other stage uses) with one passkey
phrase and `distractors` others (the calibration's long grid, multikey-style), the needle at one of
`depths` equal segments. The default (the cascade), plain ILRe at its coarse layer and plain ILRe at
l_R each compress it as a request to the engine (budget 1024, DCA `auto`); a record says whether the
whole needle phrase was kept. Plain ILRe at the coarse layer reads the encoding the cascade's first
stage left in the document cache. Its section of the results page and its command: evaluation/report/other_corpus.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ...compressor.calibration import needle_kept
from ...compressor.strategies import make_strategy
from ...contract.messages import CompressRequest
from ..tasks.lengths import length_label
from ..tasks.passkey import make_passkey_sample

if TYPE_CHECKING:
    from ...engine.engine import Engine

SOURCE = "pydoc"
OUTPUT = Path("results/eval/other_corpus.jsonl")


def run_other_corpus(lengths: list[int], depths: int, distractors: int, output: Path, budget: int = 1024,
                     digits: int = 8, progress=print, engine: Engine | None = None) -> Path:
    """Measure every (length, depth) not yet in `output` (JSONL, appended) on `engine` (None: the embedded model's,
    `--dtype auto`); returns `output`."""
    from ...engine.engine import Engine, EngineConfig

    engine = engine or Engine(EngineConfig())
    coarse, l_r = engine.with_profile(make_strategy("cascade")).coarse_layer, engine.layer
    rows = {"cascade": {"strategy": "cascade"}, f"ilre@{coarse}": {"strategy": "ilre", "layer": coarse},
            f"ilre@{l_r}": {"strategy": "ilre", "layer": l_r}}  # the cascade first: its coarse encoding is then cached
    done = {(r["length"], r["depth"], r["strategy"]) for r in load(output)}
    for length in lengths:
        for depth in range(depths):
            if all((length, depth, name) in done for name in rows):
                continue
            sample = make_passkey_sample(engine.tokenizer, length, depth / depths, digits, seed=11, source=SOURCE,
                                         distractors=distractors)
            records = []
            for name, fields in rows.items():
                tick = time.perf_counter()
                result = engine.compress(CompressRequest(context_ids=sample.context_ids, query_ids=sample.query_ids,
                                                         budget=budget, **fields))
                seconds = time.perf_counter() - tick
                kept = needle_kept(torch.tensor(result.kept_indices), sample.needle)
                records.append((name, kept, round(seconds, 3) if name == "cascade" else None))
            with output.open("a") as f:
                for name, kept, seconds in records:
                    f.write(json.dumps({"source": SOURCE, "length": length, "depth": depth, "strategy": name,
                                        "distractors": distractors, "budget": budget, "kept": kept,
                                        "seconds": seconds}) + "\n")
            progress(f"{SOURCE} {length_label(length)} depth {depth}/{depths}: "
                     + " ".join(f"{n}={'kept' if k else 'lost'}" for n, k, _ in records))
        engine.documents.clear()  # one length's documents at a time
    return output


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
