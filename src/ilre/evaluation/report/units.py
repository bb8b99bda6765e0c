"""The results page's section on whole units (`granularity` "unit") against single tokens and RAG.

Three views, each paired on the samples both sides ran: end to end (the reader's score) per length;
retention per length over every task, and per task and length (where units trail tokens is marked);
per task the share of the units a selection touches that it keeps whole; and on the tasks with tables, the
share of the kept rows whose table header is kept with them.
"""

from __future__ import annotations

from statistics import mean

from .headline import comparison, gap, retention_by_sample, why
from ..tasks.lengths import length_label
from ..tasks.ruler import TASKS

UNIT_PAIRS = (("cascade_units", "cascade"), ("cascade_units", "rag"), ("cascade_units_nl", "cascade_units"),
              ("ilre_units", "ilre"))
RETENTION_PAIRS = (("cascade_units", "cascade"), ("cascade_units", "rag"))
SHARE_ROWS = ("cascade", "cascade_units", "rag")


def units_section(records: list[dict], labels: dict[str, str]) -> list[str]:
    """Markdown lines of the section (none when no record keeps units); `labels` names the strategies."""
    e2e = _pair_rows(records, UNIT_PAIRS, "e2e", labels)
    retention = _pair_rows(records, RETENTION_PAIRS, "retention", labels)
    shares = [r for r in records if r.get("whole_units") is not None and r["strategy"] in SHARE_ROWS]
    if not e2e and not retention and not shares:
        return []
    out = ["## Whole units against single tokens", "",
           "`granularity` \"unit\" keeps whole sentences, lines, records and messages around the strategy's own choice "
           "(README, How it works). Each row: the score with units minus the other's, in points, on the samples both "
           "ran, with its 95% paired-bootstrap interval.", ""]
    header = ["| pair | length | difference | pairs | verdict | largest per-task differences |",
              "| --- | --- | ---: | ---: | --- | --- |"]
    if e2e:
        out += ["End to end (the embedded reader answers from the compressed context):", "", *header, *e2e, ""]
    if retention:
        out += ["Retention (the gold answer kept in the compressed context), every task:", "", *header, *retention, ""]
        out += _per_task(records, labels)
    if shares:
        out += _shares(shares, labels)
    return out


def _pair_rows(records: list[dict], pairs: tuple[tuple[str, str], ...], field: str, labels: dict[str, str]) -> list[str]:
    rows = []
    for ours, peer in pairs:
        for n in sorted({r["length"] for r in records if r["strategy"] == ours and r.get(field) is not None}):
            c = comparison(retention_by_sample(records, n, field), ours, peer)
            if c is not None:
                rows.append(f"| {labels[ours]} vs {labels[peer]} | {length_label(n)} | {gap(c)} | {c['n']} | "
                            f"{c['verdict']} | {why(c)} |")
    return rows


def _per_task(records: list[dict], labels: dict[str, str]) -> list[str]:
    """Per task and length: tokens / units retention % on their shared samples; ▼ where units keep less."""
    ours, peer = RETENTION_PAIRS[0]
    lengths = sorted({r["length"] for r in records if r["strategy"] == ours and r.get("retention") is not None})
    rows = []
    for task in TASKS:
        cells = []
        for n in lengths:
            samples = retention_by_sample([r for r in records if r["task"] == task], n)
            keys = sorted(set(samples.get(ours, {})) & set(samples.get(peer, {})))
            if not keys:
                cells.append("–")
                continue
            a, b = (100 * mean(samples[name][k] for k in keys) for name in (peer, ours))
            cells.append(f"{a:.0f} / {b:.0f}{' ▼' if b < a else ''} ({len(keys)})")
        if any(cell != "–" for cell in cells):
            rows.append(f"| {task} | " + " | ".join(cells) + " |")
    return [f"Retention per task, % ({labels[peer]} / {labels[ours]}, samples), ▼ where units keep less:", "",
            "| task | " + " | ".join(length_label(n) for n in lengths) + " |", "| --- |" + " ---: |" * len(lengths),
            *rows, ""]


def _shares(shares: list[dict], labels: dict[str, str]) -> list[str]:
    lengths = sorted({r["length"] for r in shares})
    out = ["Of the units a selection touches (sink aside), the share it keeps whole, % (mean over samples and "
           "lengths " + ", ".join(length_label(n) for n in lengths) + "):", "",
           "| task | " + " | ".join(labels[s] for s in SHARE_ROWS) + " |", "| --- |" + " ---: |" * len(SHARE_ROWS)]
    for task in [t for t in TASKS if any(r["task"] == t for r in shares)]:
        cells = []
        for name in SHARE_ROWS:
            values = [r["whole_units"] for r in shares if r["task"] == task and r["strategy"] == name]
            cells.append(f"{100 * mean(values):.0f}" if values else "–")
        out.append(f"| {task} | " + " | ".join(cells) + " |")
    return [*out, ""]


def headers_section(records: list[dict], labels: dict[str, str]) -> list[str]:
    """Markdown lines: per table task, budget and length, of the table rows a selection keeps whole, the share
    kept with their header, % (tokens / units, samples that kept a whole row); none without such records."""
    ours, peer = RETENTION_PAIRS[0]
    headed = [r for r in records if r.get("headed_rows") is not None and r["strategy"] in (ours, peer)]
    if not headed:
        return []
    lengths = sorted({r["length"] for r in headed})
    rows = []
    for task in [t for t in TASKS if any(r["task"] == t for r in headed)]:
        for budget in sorted({r["budget"] for r in headed if r["task"] == task}):
            cells = []
            for n in lengths:
                values = {name: [r["headed_rows"] for r in headed
                                 if (r["task"], r["length"], r["strategy"], r["budget"]) == (task, n, name, budget)]
                          for name in (peer, ours)}
                cells.append(" / ".join(f"{100 * mean(v):.0f} ({len(v)})" if v else "–" for v in values.values()))
            rows.append(f"| {task} | {budget} | " + " | ".join(cells) + " |")
    return [f"Table rows kept whole, the share kept with their table's header, % ({labels[peer]} / {labels[ours]}; "
            "samples that kept a whole row):", "",
            "| task | budget | " + " | ".join(length_label(n) for n in lengths) + " |",
            "| --- | ---: |" + " ---: |" * len(lengths), *rows, ""]
