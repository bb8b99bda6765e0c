"""The results page's comparison of models: each run's default (the strategy a request names none of) at one
budget, per length and per task, with 95% intervals, and the paired difference of the later runs against the first.

A run is a results folder of `ilre eval` (its raw.jsonl and meta.json). Samples pair on task, length and sample
index: the RULER tasks draw the same needles for every tokenizer; the record tasks draw theirs as they fill each
tokenizer's length, so there the pairing is on the seed alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

from ...models.profiles import load_profile
from ..running.records import load_records
from ..tasks.lengths import length_label
from ..tasks.ruler import TASKS
from .headline import DEFAULT, comparison, gap, why
from .intervals import wilson

NO_SHARED_WORDS = ("vt", "niah_paraphrase")  # tasks whose answer shares no rare word with the question


@dataclass(frozen=True)
class ModelRun:
    """One model's default records (retention) at the page's budget; `form`: what its default runs (`default_form`)."""

    model: str
    form: str
    native: int
    records: list[dict]


def default_form(model: str, layer: int | None) -> str:
    """What a model's default runs, from its stored profile: "cascade, coarse layer 8, l_R 19" or
    "plain ILRe at l_R 6 (no cascade)" where calibration found no coarse layer below l_R."""
    profile = load_profile(model, num_layers=max(1, layer or 1))
    coarse = profile.strategy_options(DEFAULT).get("coarse_layer")
    at = layer if layer is not None else profile.retrieval_layer
    return f"cascade, coarse layer {coarse}, l_R {at}" if coarse else f"plain ILRe at l_R {at} (no cascade)"


def load_run(results_dir: Path, budget: int) -> ModelRun | None:
    """The default's records of a results folder at `budget` (the latest record of each sample), or None."""
    raw, meta_path = results_dir / "raw.jsonl", results_dir / "meta.json"
    if not raw.is_file():
        return None
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    latest: dict[tuple, dict] = {}
    for r in load_records(raw):
        if r["strategy"] == DEFAULT and r["budget"] == budget and r.get("retention") is not None:
            latest[(r["task"], r["length"], r["index"], r["seed"])] = r
    if not latest:
        return None
    model = str(meta.get("model", results_dir.name))
    layer = meta.get("layers", {}).get(DEFAULT, meta.get("layer"))
    return ModelRun(model, default_form(model, layer), int(meta.get("native_context", 0)),
                    list(latest.values()))


def _by_sample(run: ModelRun, length: int, tasks: set[str]) -> dict[tuple, float]:
    return {(r["task"], r["index"], r["seed"]): float(r["retention"]) for r in run.records
            if r["length"] == length and r["task"] in tasks}


def _cell(values: list[float]) -> str:
    if not values:
        return "–"
    low, high = wilson(min(1.0, max(0.0, mean(values))), len(values))
    return f"{100 * mean(values):.0f} [{100 * low:.0f}–{100 * high:.0f}] ({len(values)})"


def models_section(runs: list[ModelRun]) -> list[str]:
    """Markdown lines comparing the runs' defaults (the first run is the reference): retention over the tasks
    every run has at each length, each later run's paired difference from the first, every task's cells, and what
    the tasks whose question shares no word with its answer say about a longer native window."""
    if len(runs) < 2:
        return []
    tasks = [t for t in TASKS if all(any(r["task"] == t for r in run.records) for run in runs)]
    lengths = sorted({r["length"] for r in runs[0].records if r["task"] in tasks}
                     & set.intersection(*({r["length"] for r in run.records} for run in runs[1:])))
    if not tasks or not lengths:
        return []
    first = runs[0]
    out = [f"## Models side by side: {' and '.join(run.model for run in runs)}", "",
           "Each model's default (what a request naming no strategy runs) at the same budget on the same tasks and "
           "sample indices. Each cell: retention % [95% Wilson interval] (samples). Samples pair on task, length and "
           "index: the RULER tasks plant the same needles for every tokenizer; the record tasks draw theirs as they "
           "fill each tokenizer's length. Native windows: " + ", ".join(
               f"{run.model} {run.native} tokens" for run in runs) + ".", "",
           "- " + "\n- ".join(f"**{run.model}**: {run.form}" for run in runs), "",
           "| model | " + " | ".join(length_label(n) for n in lengths) + " |", "| --- |" + " ---: |" * len(lengths)]
    shared = {n: {t for t in tasks if all(any(r["task"] == t and r["length"] == n for r in run.records) for run in runs)}
              for n in lengths}  # per length, the tasks every model ran there
    for run in runs:
        out.append(f"| {run.model} | " + " | ".join(_cell(list(_by_sample(run, n, shared[n]).values())) for n in lengths)
                   + " |")
    out += ["", "Each length's row pools the tasks every model ran at that length (the table below names them).", ""]
    for run in runs[1:]:
        for n in lengths:
            c = _paired(run, first, n, shared[n])
            if c is not None:
                out.append(f"- **{length_label(n)}**: {run.model} {c['verdict']} {first.model} ({gap(c, ' points')}, "
                           f"{c['n']} paired samples of {c['tasks']} tasks; {why(c)}).")
    out += ["", "Per task (" + " / ".join(run.model for run in runs) + "):", "",
            "| task | " + " | ".join(length_label(n) for n in lengths) + " |", "| --- |" + " ---: |" * len(lengths)]
    for task in tasks:
        cells = [" / ".join(_cell(list(_by_sample(run, n, {task}).values())) for run in runs) for n in lengths]
        cells = ["–" if set(cell.split(" / ")) == {"–"} else cell for cell in cells]
        out.append(f"| {task} | " + " | ".join(cells) + " |")
    out += [""] + _window_lines(runs, lengths)
    return out + [""]


def _paired(run: ModelRun, first: ModelRun, length: int, tasks: set[str]) -> dict | None:
    samples = {"run": _by_sample(run, length, tasks), "first": _by_sample(first, length, tasks)}
    return comparison(samples, "run", "first") if samples["run"] and samples["first"] else None


def _window_lines(runs: list[ModelRun], lengths: list[int]) -> list[str]:
    """Whether a longer native window closes the gap on the tasks a lexical match cannot find: each later run
    against the first past the first's window and within the run's own, pooled over those lengths."""
    first, out = runs[0], []
    for run in runs[1:]:
        past = [n for n in lengths if first.native < n <= run.native] if run.native > first.native else []
        for task in (t for t in NO_SHARED_WORDS if any(r["task"] == t for r in run.records)):
            if not past:
                continue
            pairs = {"run": {}, "first": {}}
            for n in past:
                for side, model in (("run", run), ("first", first)):
                    pairs[side].update({(n, *k): v for k, v in _by_sample(model, n, {task}).items()})
            c = comparison(pairs, "run", "first")
            if c is None:
                continue
            kept = {side: sum(pairs[side].values()) for side in pairs}
            span = ", ".join(length_label(n) for n in past)
            said = ("closes part of the gap" if c["verdict"] == "leads" else "does not close the gap: "
                    + ("it keeps fewer" if c["verdict"] == "trails" else "the samples cannot separate the two models"))
            out.append(f"- **{task} past {first.model}'s window, within {run.model}'s ({span})**: {run.model} keeps "
                       f"{kept['run']:.0f} of {len(pairs['run'])}, {first.model} {kept['first']:.0f} of "
                       f"{len(pairs['first'])}; paired difference {gap(c, ' points')} on {c['n']} samples: "
                       f"{run.model}'s {run.native}-token window {said}.")
    return out + [""] if out else []
