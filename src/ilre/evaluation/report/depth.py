"""The results page's pairing of the default against plain ILRe at l_R, sample by sample, from the records.

The default reads the whole context to l_R only when a request asks (`coarse_below` / `deepen_below`, both 0 in
the profile: README, How it works), so its retention is that of its candidates alone: the `cascade_candidates`
row (the default with its fallback off, on the same samples) where measured, and at 4K the `cascade` row
(4 x the budget covers a 4K context, so the default runs as ILRe at l_R with the coarse layer blended). It is
paired with the `ilre` row at l_R of the same sample; the mean difference in retention points and its 95%
percentile-bootstrap interval (intervals.paired_difference) say whether it leads, ties or trails, per length;
a per-task table lists where it trails. Usage: python -m ilre.evaluation.report.depth [--results-dir results/eval]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..running.records import load_records
from ..tasks.lengths import length_label
from .headline import DEFAULT, comparison, gap, retention_by_sample

CANDIDATES_ROW, WHOLE_LENGTH = "cascade_candidates", 4096


def as_configured(records: list[dict]) -> list[dict]:
    """The records with the default's rows as the profile now runs it: a `cascade_candidates` row becomes the
    default's row of its sample; a `cascade` row stays only where 4 x the budget covers the context (4K: no
    candidate pass, no fallback); every other `cascade` row (it may have fallen back) is left out."""
    out = []
    for r in records:
        if r["strategy"] == CANDIDATES_ROW:
            out.append({**r, "strategy": DEFAULT})
        elif r["strategy"] != DEFAULT or r["length"] <= WHOLE_LENGTH:
            out.append(r)
    return out


def default_against_l_r(records: list[dict], l_r: int = 19) -> dict[int, dict]:
    """length -> the paired comparison (headline.comparison) of the default as configured with plain ILRe at l_R,
    budget 1024, on the samples both measured."""
    chosen = [r for r in as_configured(records) if r["budget"] == 1024
              and (r["strategy"] == DEFAULT or (r["strategy"] == "ilre" and r.get("layer") == l_r))]
    out = {}
    for length in sorted({r["length"] for r in chosen}):
        c = comparison(retention_by_sample(chosen, length), DEFAULT, "ilre") \
            if any(r["strategy"] == DEFAULT and r["length"] == length for r in chosen) else None
        if c is not None:
            out[length] = c
    return out


def depth_section(records: list[dict], l_r: int = 19) -> list[str]:
    """Markdown lines: per length the paired difference and its verdict, then where the default trails, by task."""
    compared = default_against_l_r(records, l_r)
    if not compared:
        return []
    lines = ["## The default against plain ILRe at l_R, sample by sample", "",
             f"The default as the profile runs it (its candidates alone: the `{CANDIDATES_ROW}` row; at 4K the `cascade` "
             f"row, which covers the context) against plain ILRe at layer {l_r}, on the samples both measured "
             "(budget 1024, token granularity). Difference in retention points, default minus l_R, with its 95% interval.",
             "", "| length | pairs (tasks) | difference | verdict |", "| --- | ---: | ---: | --- |"]
    trailing = []
    for length, c in compared.items():
        lines.append(f"| {length_label(length)} | {c['n']} ({c['tasks']}) | {gap(c)} | {c['verdict']} |")
        trailing += [f"| {length_label(length)} | {task} | {diff:+.1f} |" for task, diff in c["by_task"] if diff < 0]
    lines += ["", "Where it trails (mean difference per task, retention points):", ""]
    lines += ["| length | task | difference |", "| --- | --- | ---: |", *trailing] if trailing else ["Nowhere."]
    return lines + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", type=Path, default=Path("results/eval"))
    parser.add_argument("--layer", type=int, default=19, help="l_R of the records' plain ILRe rows")
    args = parser.parse_args()
    lines = depth_section(load_records(args.results_dir / "raw.jsonl"), args.layer)
    print("\n".join(lines) if lines else "no sample measured by both the default and plain ILRe at l_R")


if __name__ == "__main__":
    main()
