"""The results page's headline: per length, every strategy's all-task retention with its 95% interval,
and where ilre's best strategy leads, ties or trails each outside baseline.

A comparison uses only the samples both strategies ran (same task, length, sample index and seed), so a
baseline run on fewer tasks is compared on those. "Leads" and "trails" need the 95% paired-bootstrap
interval of the mean difference to exclude zero; otherwise the samples cannot tell them apart ("tie").
The per-task differences that make up the gap are listed with it: they are the why.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import mean

from ..tasks.lengths import length_label
from .intervals import paired_difference, wilson

OURS = ("cascade", "cascade_units", "ilre", "ilre_units", "ilre_fast_too", "ilre_fast_half", "snapkv", "lagkv", "reattention", "locret", "actqkv", "actqkv_auto")
BASELINES = ("rag", "longllmlingua", "llmlingua", "streaming_llm")
DEFAULT = "cascade"  # the strategy a request gets when it names none
# (an option of a strategy, the strategy without it); ILRe + layer 8 at half weight is also what the default
# becomes on a deepened document (engine/deepening.py), so it is set against the cascade too; the default
# against itself without its fallback (`deepen_below` 0) says what the fallback keeps
VARIANTS = (("cascade", "ilre"), ("cascade", "cascade_candidates"), ("cascade_units", "cascade"), ("ilre_units", "ilre"), ("ilre_fast_too", "ilre"),
            ("ilre_fast_half", "ilre"), ("ilre_fast_half", "cascade"), ("ilre_nodca", "ilre"))


def retention_by_sample(records: list[dict], length: int, field: str = "retention") -> dict[str, dict[tuple, float]]:
    """strategy -> {(task, index, seed): retention (or another per-sample `field`, e.g. e2e)} at one length."""
    out: dict[str, dict[tuple, float]] = defaultdict(dict)
    for r in records:
        if r["length"] == length and r.get(field) is not None:
            out[r["strategy"]][(r["task"], r["index"], r["seed"])] = float(r[field])
    return out


def best_ours(samples: dict[str, dict[tuple, float]]) -> str | None:
    """The ilre strategy with the highest mean among those that ran the most samples at this length
    (a strategy run on the easy tasks alone cannot win on a smaller set)."""
    ours = {s: v for s, v in samples.items() if s in OURS and v}
    if not ours:
        return None
    most = max(len(v) for v in ours.values())
    full = [s for s, v in ours.items() if len(v) == most]
    return max(full, key=lambda s: (mean(samples[s].values()), -OURS.index(s)))


def comparison(samples: dict[str, dict[tuple, float]], ours: str, peer: str) -> dict | None:
    """Paired comparison of `ours` with `peer`: mean difference in points, its interval, the verdict and
    the tasks that differ most."""
    keys = sorted(set(samples[ours]) & set(samples.get(peer, {})))
    if not keys:
        return None
    diff, low, high = paired_difference([(samples[ours][k], samples[peer][k]) for k in keys])
    verdict = "leads" if low > 0 else "trails" if high < 0 else "ties"
    per_task: dict[str, list[float]] = defaultdict(list)
    for k in keys:
        per_task[k[0]].append(samples[ours][k] - samples[peer][k])
    tasks = sorted(((t, 100 * mean(d)) for t, d in per_task.items() if mean(d) != 0), key=lambda x: -abs(x[1]))
    return {"peer": peer, "n": len(keys), "tasks": len(per_task), "diff": 100 * diff, "low": 100 * low,
            "high": 100 * high, "verdict": verdict, "by_task": tasks}


def gap(c: dict, unit: str = "") -> str:
    """A comparison's mean difference and its interval, in points: "+12.5 [+7.7, +17.5]" (unit after the mean)."""
    return f"{c['diff']:+.1f}{unit} [{c['low']:+.1f}, {c['high']:+.1f}]"


def why(c: dict, top: int = 3) -> str:
    """The tasks that move a comparison most: "vt +44, cwe +23"."""
    return ", ".join(f"{t} {d:+.0f}" for t, d in c["by_task"][:top]) or "no task differs"


def _cell(values: list[float]) -> str:
    low, high = wilson(min(1.0, max(0.0, mean(values))), len(values))
    return f"{100 * mean(values):.0f} [{100 * low:.0f}–{100 * high:.0f}] ({len(values)})"


def headline(records: list[dict], labels: dict[str, str], order: tuple[str, ...]) -> list[str]:
    """Markdown lines: a table of all-task means with Wilson intervals per length, then one statement
    per length on how the best ilre strategy compares with each baseline."""
    lengths = sorted({r["length"] for r in records})
    per_length = {n: retention_by_sample(records, n) for n in lengths}
    names = [s for s in order if s != "full" and any(per_length[n].get(s) for n in lengths)]
    if not names:
        return []
    out = ["## Headline: retention over every task run, per length", "",
           "Each cell: mean % [95% Wilson interval] (samples = tasks x samples per task). Below the table, ilre's "
           "best strategy at each length (and the default, ILRe, where another is best) against each baseline on the samples both ran: the mean difference in "
           "points with its 95% paired-bootstrap interval; it **leads** or **trails** only when that interval "
           "excludes zero, else the samples cannot separate them (**ties**). The tasks with the largest "
           "differences say where the gap comes from.", "",
           "| strategy | " + " | ".join(length_label(n) for n in lengths) + " |",
           "| --- |" + " ---: |" * len(lengths)]
    for name in names:
        cells = [_cell(list(per_length[n][name].values())) if per_length[n].get(name) else "–" for n in lengths]
        out.append(f"| {labels[name]} | " + " | ".join(cells) + " |")
    out.append("")
    for n in lengths:
        samples = per_length[n]
        best = best_ours(samples)
        if best is None:
            continue
        for ours in dict.fromkeys([best] + [DEFAULT] * bool(samples.get(DEFAULT))):  # the default too, when another is best
            parts = []
            for peer in BASELINES:
                c = comparison(samples, ours, peer)
                if c is not None:
                    parts.append(f"{c['verdict']} {labels[peer]} ({gap(c, ' points')}, {c['n']} paired "
                                 f"samples of {c['tasks']} task{'s' * (c['tasks'] != 1)}; {why(c)})")
            if parts:
                role = "" if ours == best else " (the default)"
                out.append(f"- **{length_label(n)}**: {labels[ours]}{role} " + "; ".join(parts) + ".")
    return out + [""]


def variant_section(records: list[dict], labels: dict[str, str], groups: dict[str, tuple[str, ...]]) -> list[str]:
    """Markdown lines: each option of a strategy (VARIANTS) against the strategy without it, per length, on
    all the tasks both ran and on each named group of tasks: the paired mean difference with its bootstrap interval,
    and the tasks that move it. An option is kept only where this says it leads."""
    rows = []
    for variant, base in VARIANTS:
        for n in sorted({r["length"] for r in records if r["strategy"] == variant}):
            shown = None
            for group, tasks in {"all tasks both ran": (), **groups}.items():
                picked = [r for r in records if not tasks or r["task"] in tasks]
                c = comparison(retention_by_sample(picked, n), variant, base)
                if c is None or c == shown:  # a group that is every task both ran adds nothing
                    continue
                shown = shown or c
                rows.append(f"| {labels[variant]} vs {labels[base]} | {length_label(n)} | {group} | {gap(c)} | {c['n']} "
                            f"| {c['verdict']} | {why(c)} |")
    if not rows:
        return []
    return ["## Options against the strategy without them", "",
            "Each row: the option's retention minus the plain strategy's on the samples both ran, in points, with its "
            "95% paired-bootstrap interval; **leads** / **trails** only when the interval excludes zero.", "",
            "| option | length | tasks | difference | pairs | verdict | largest per-task differences |",
            "| --- | --- | --- | ---: | ---: | --- | --- |", *rows, ""]
