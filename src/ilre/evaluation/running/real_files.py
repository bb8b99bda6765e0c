"""Whole units checked on real files the suite does not generate (evaluation/tasks/real_files.py).

Each sample is compressed by the engine as a service request would be (the default strategy, budget
1024, DCA auto), with `granularity` token and unit on the same document (the second request reuses
the cached encode). A record says whether the answer survived and whether the asked row (line) was
kept whole (and, in the table, whether its header row was kept), whether the default fell back to the whole
context (compressor/strategies/cascade.py) and the compressor's dtype. Files that are missing are skipped and said so.
The command, which prints the section after measuring: evaluation/report/real_files.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..tasks.lengths import length_label
from ..tasks.real_files import SOURCES, make_sample

OUTPUT = Path("results/eval/real_files.jsonl")
EARLIER = OUTPUT.with_name("real_files_stage20.jsonl")  # stages 20-21: the default before its fallback


def run_real_files(lengths: list[int], samples: int, output: Path = OUTPUT, budget: int = 1024, progress=print,
                   corpora: tuple[str, ...] = tuple(SOURCES)) -> Path:
    """Measure every (corpus, length, index) of `corpora` not yet in `output` (JSONL, appended), in that order;
    returns `output`."""
    from ...engine.engine import Engine, EngineConfig
    from ...contract.messages import CompressRequest

    engine = Engine(EngineConfig())
    done = {(r["corpus"], r["length"], r["index"], r["granularity"]) for r in load(output)}
    output.parent.mkdir(parents=True, exist_ok=True)
    for corpus in corpora:
        path = SOURCES[corpus]
        if not path.is_file():
            progress(f"real files: {path} is not on this machine, {corpus} skipped")
            continue
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
        for length in lengths:
            for index in range(samples):
                if all((corpus, length, index, g) in done for g in ("token", "unit")):
                    continue
                sample = make_sample(engine.tokenizer, corpus, lines, length, index)
                if sample is None:
                    continue
                records = []
                for granularity in ("token", "unit"):
                    tick = time.perf_counter()
                    result = engine.compress(CompressRequest(context=sample["context"], query=sample["query"],
                                                             budget=budget, granularity=granularity))
                    text = result.compressed_context
                    records.append({"corpus": corpus, "length": length, "index": index, "granularity": granularity,
                                    "tokens": result.original_tokens, "kept": sample["answer"] in text,
                                    "line_whole": sample["line"] in text,
                                    "header_kept": sample["header"] in text if sample.get("header") else None,
                                    "seconds": round(time.perf_counter() - tick, 3),
                                    "fell_back": result.fell_back, "dtype": engine.placement.dtype_name})
                engine.documents.clear()
                with output.open("a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in records)
                progress(f"{corpus} {length_label(length)} #{index}: " + " ".join(
                    f"{r['granularity']}={int(r['kept'])}/{int(r['line_whole'])}" for r in records))
    return output


def load(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.is_file() else []
