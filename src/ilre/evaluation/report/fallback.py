"""The results page's section on the default's fallback: how often it reads the whole context, and what its
threshold buys.

The default (the cascade) reads the whole context to l_R when l_R's attention over its candidates is weak
(`deepen_below`, compressor/strategies/cascade.py). Its records carry the peak strength it measured (`peak`),
and the `cascade` rows whether they fell back (`fell_back`). Two views:

- per task and length, the samples that fall back at the profile's threshold: the `cascade` row's
  `fell_back`, else the `cascade_candidates` row's peak (the same candidates, the same peak) against it;
- the threshold replayed per sample: the candidates alone (`cascade_candidates`, the default with
  `deepen_below` 0) where the peak reaches it, the whole context (`ilre_fast_half`: ILRe at l_R with the
  coarse layer at half weight, what the fallback runs) where it does not; retention and the share that
  falls back, per threshold and length, on the samples both rows ran.

    python -m ilre.evaluation.report.fallback [--results-dir results/eval] [--thresholds 0,0.4,0.5,0.6,0.7]
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path
from statistics import mean

from ..running.records import load_records
from ..tasks.lengths import length_label
from ..tasks.ruler import TASKS

CANDIDATES_ROW = "cascade_candidates"  # the default without its fallback
WHOLE_ROW = "ilre_fast_half"  # what the fallback runs: the whole context to l_R, the coarse layer at half weight
THRESHOLDS = (0.0, 0.4, 0.5, 0.6, 0.7)

STAGE22_THRESHOLD = 0.6  # the threshold these records were measured under (stages 22-24, the fallback after the candidates)


def falls_back(records: list[dict], threshold: float = STAGE22_THRESHOLD) -> dict[tuple, bool]:
    """(task, length, index, seed) -> whether the default falls back on that sample at the profile's threshold:
    its `cascade` row's `fell_back` where recorded, else its `cascade_candidates` row's peak < `threshold`."""
    out: dict[tuple, bool] = {}
    for r in records:
        key = (r["task"], r["length"], r["index"], r["seed"])
        if r["strategy"] == "cascade" and r.get("fell_back") is not None:
            out[key] = bool(r["fell_back"])
        elif r["strategy"] == CANDIDATES_ROW and r.get("peak") is not None:
            out.setdefault(key, r["peak"] < threshold)
    return out


def share_table(records: list[dict], threshold: float = STAGE22_THRESHOLD) -> list[str]:
    """Markdown rows: per task, the samples that fall back of those measured, per length."""
    cells: dict[tuple[str, int], list[bool]] = defaultdict(list)
    for (task, length, _, _), fell in falls_back(records, threshold).items():
        cells[task, length].append(fell)
    if not cells:
        return []
    lengths = sorted({length for _, length in cells})
    tasks = sorted({task for task, _ in cells}, key=list(TASKS).index)
    rows = [f"| task | {' | '.join(map(length_label, lengths))} |", "| --- |" + " ---: |" * len(lengths)]
    for task in tasks:
        row = [f"{sum(c)}/{len(c)}" if (c := cells.get((task, length))) else "" for length in lengths]
        rows.append(f"| {task} | {' | '.join(row)} |")
    return rows


def seconds_lines(records: list[dict]) -> list[str]:
    """Per length, the `cascade` rows' compress_s: mean and range of the samples that fell back and of those that did not."""
    times: dict[tuple[int, bool], list[float]] = defaultdict(list)
    for r in records:
        if r["strategy"] == "cascade" and r.get("fell_back") is not None:
            times[r["length"], bool(r["fell_back"])].append(r["compress_s"])
    out = []
    for length in sorted({length for length, _ in times}):
        parts = [f"{what} {mean(t):.1f} s ({min(t):.1f}-{max(t):.1f}, {len(t)} samples)"
                 for what, t in (("fell back", times.get((length, True))), ("did not", times.get((length, False)))) if t]
        out.append(f"- {length_label(length)}: " + "; ".join(parts))
    return out


def uncharged_lines(records: list[dict]) -> list[str]:
    """Per row, the samples whose compress_s lacks part of the row's cost (a record's `timing` says what), by length."""
    totals = Counter((r["strategy"], r["length"]) for r in records)
    lacking = Counter((r["strategy"], r["timing"], r["length"]) for r in records if r.get("timing"))
    rows: dict[tuple[str, str], list[str]] = defaultdict(list)
    for (strategy, why, length), n in sorted(lacking.items(), key=lambda kv: kv[0][2]):
        rows[strategy, why].append(f"{length_label(length)} {n} of {totals[strategy, length]}")
    return [f"- {strategy}: {', '.join(cells)} samples: {why}" for (strategy, why), cells in sorted(rows.items())]


def replay(records: list[dict], thresholds: tuple[float, ...] = THRESHOLDS) -> dict[int, dict]:
    """length -> {"samples", "tasks", "kept": [retention % per threshold], "fall": [% falling back per threshold],
    "by_task": {task: [retention % per threshold]} (only tasks whose retention depends on the threshold)}."""
    pairs: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in records:
        if r["strategy"] in (CANDIDATES_ROW, WHOLE_ROW):
            pairs[r["task"], r["length"], r["index"], r["seed"]][r["strategy"]] = r
    by_length: dict[int, list[tuple[dict, dict]]] = defaultdict(list)
    for (_, length, _, _), rows in pairs.items():
        cand, whole = rows.get(CANDIDATES_ROW), rows.get(WHOLE_ROW)
        if cand is not None and whole is not None and cand.get("peak") is not None:
            by_length[length].append((cand, whole))
    out = {}
    for length, both in sorted(by_length.items()):
        tasks: dict[str, list[tuple[dict, dict]]] = defaultdict(list)
        for cand, whole in both:
            tasks[cand["task"]].append((cand, whole))
        by_task = {task: [_replayed(rows, t) for t in thresholds]
                   for task, rows in sorted(tasks.items(), key=lambda t: list(TASKS).index(t[0]))}
        out[length] = {"samples": len(both), "tasks": len(tasks), "kept": [_replayed(both, t) for t in thresholds],
                       "fall": [100 * mean(c["peak"] < t for c, _ in both) for t in thresholds],
                       "by_task": {task: v for task, v in by_task.items() if max(v) != min(v)}}
    return out


def _replayed(pairs: list[tuple[dict, dict]], threshold: float) -> float:
    """Retention % over (candidates row, whole-context row) pairs: the whole context's where the peak is below."""
    return 100 * mean(whole["retention"] if cand["peak"] < threshold else cand["retention"] for cand, whole in pairs)


def fallback_section(records: list[dict], threshold: float = STAGE22_THRESHOLD,
                     thresholds: tuple[float, ...] = THRESHOLDS) -> list[str]:
    """Markdown lines of the results page's section (none when no record measured a peak)."""
    shares = share_table(records, threshold)
    replayed = replay(records, thresholds)
    if not shares and not replayed:
        return []
    out = ["## When the default's candidates miss: its fallback", "",
           f"The default reads the whole context to l_R when l_R's peak attention over its candidates is below "
           f"`deepen_below` ({threshold:g} when these records were measured; the profile now sets 0 and decides before the candidate pass, `coarse_below`: README, How it works). 4K contexts run ILRe at l_R already.", ""]
    if shares:
        out += ["Samples that fall back, of those measured:", "", *shares, ""]
    seconds = seconds_lines(records)
    if seconds:
        out += ["A default (token) sample's compression time, by whether it fell back:", "", *seconds, ""]
    if replayed:
        heads = " | ".join(f"{t:g}" for t in thresholds)
        out += ["The threshold replayed on each sample: the candidates alone where the peak reaches it, the whole "
                "context (ILRe + layer 8 at half weight, what the fallback runs) where it does not. Retention % "
                "(samples falling back %):", "", f"| length | samples | {heads} |",
                "| --- | ---: |" + " ---: |" * len(thresholds)]
        for length, row in replayed.items():
            cells = " | ".join(f"{k:.1f} ({f:.0f})" for k, f in zip(row["kept"], row["fall"]))
            out.append(f"| {length_label(length)} | {row['samples']} ({row['tasks']} tasks) | {cells} |")
        changed = [f"- {length_label(length)} {task}: " + ", ".join(f"{t:g} {k:.0f}%" for t, k in zip(thresholds, kept))
                   for length, row in replayed.items() for task, kept in row["by_task"].items()]
        out += ["", "Tasks whose retention depends on the threshold:", "", *changed, ""] if changed else \
            ["", "No task's retention depends on the threshold.", ""]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", type=Path, default=Path("results/eval"))
    parser.add_argument("--thresholds", default=",".join(f"{t:g}" for t in THRESHOLDS))
    args = parser.parse_args()
    records = load_records(args.results_dir / "raw.jsonl")
    lines = fallback_section(records, thresholds=tuple(float(t) for t in args.thresholds.split(",")))
    print("\n".join(lines) if lines else f"no record measured a peak ({CANDIDATES_ROW} or cascade rows)")


if __name__ == "__main__":
    main()
