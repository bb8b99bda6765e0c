"""`ilre batch` over short contexts, as a RAG pipeline sends them: lines of ~700 tokens of Python's reference text,
a fact planted in each, at budget ratio 0.3 (every token then a candidate: the default reads them all to l_R) and at
budget 96 (a candidate pass over 384 of them). The real command, a fresh process and fresh lines per run: lines per
second from its start and from its first output line (start-up left out), and the facts kept.

    .venv/bin/python bench/short_lines_bench.py [--lines 120] [--runs 2] [--dtype auto] [--sizings ratio=0.3,budget=96]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batch_bench import ILRE, corpus  # noqa: E402


def run_once(lines: int, sizing: dict, offset: int, dtype: str, work: Path) -> dict:
    """One `ilre batch` process over `lines` fresh lines: seconds from its start and from its first output line."""
    tag = "-".join(f"{k}{v}" for k, v in sizing.items())  # a run of its own: `ilre batch` goes on with an output it finds
    source, output = work / f"in-{tag}-{offset}.jsonl", work / f"out-{tag}-{offset}.jsonl"
    corpus(source, lines, sizing, offset)
    start = time.monotonic()
    proc = subprocess.Popen([*ILRE, "batch", "--input", str(source), "--output", str(output), "--dtype", dtype],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "ILRE_DEEPEN": "hold"})
    first = None
    while proc.poll() is None:
        if first is None and output.exists() and output.stat().st_size > 0:
            first = time.monotonic()
        time.sleep(0.05)
    end = time.monotonic()
    if proc.returncode != 0:
        raise SystemExit(f"ilre batch failed: {proc.stderr.read().decode()[-400:]}")
    results = [json.loads(line) for line in output.read_text().splitlines()]
    kept = sum(f"is {100000 + int(r['id'][1:])}" in r.get("compressed_context", "") for r in results)
    first = first or end
    return {"lines": len(results), "total_s": end - start, "after_first_s": end - first, "kept": kept,
            "tokens": sum(r.get("original_tokens", 0) for r in results)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=120)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--sizings", default="ratio=0.3,budget=96")
    args = parser.parse_args()
    sizings = [{k: (float(v) if k == "ratio" else int(v))} for k, v in (s.split("=") for s in args.sizings.split(","))]
    print(f"`ilre batch`, {args.lines} lines of ~700 tokens a run, --dtype {args.dtype}, 16 in flight, fresh lines and "
          "process per run")
    print("| sizing | run | lines/s from start | lines/s after the first line | context tokens/s | facts kept |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for sizing in sizings:
            for run in range(args.runs):
                got = run_once(args.lines, sizing, 97 * run + 13, args.dtype, Path(tmp))
                rest = max(got["lines"] - 1, 1) / max(got["after_first_s"], 1e-9)
                name = ", ".join(f"{k} {v}" for k, v in sizing.items())
                print(f"| {name} | {run + 1} | {got['lines'] / got['total_s']:.2f} | {rest:.2f} | "
                      f"{got['tokens'] / got['total_s']:,.0f} | {got['kept']}/{got['lines']} |", flush=True)


if __name__ == "__main__":
    main()
