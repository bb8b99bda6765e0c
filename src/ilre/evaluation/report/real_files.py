"""Whole units checked on real files the suite does not generate: a table and a log of this machine.

The results page's section on them (token against unit on the same document), and the command that measures
what results/eval/real_files.jsonl lacks (evaluation/running/real_files.py; the samples:
evaluation/tasks/real_files.py), then prints the section:

    python -m ilre.evaluation.report.real_files [--lengths 16K,32K] [--samples 10] [--corpora pypi_tsv,dpkg_log,litellm_prices]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..running.real_files import EARLIER, OUTPUT, load, run_real_files
from ..tasks.lengths import length_label, parse_length
from ..tasks.real_files import SOURCES
from .intervals import paired_difference, wilson


def section(path: Path = OUTPUT, earlier: Path | None = None) -> list[str]:
    """Markdown lines for the results page: per corpus and length, the answer kept and the asked line kept
    whole, token against unit, with the paired difference of the answer kept. `earlier`: records of an
    earlier measurement (another default), shown for the corpora and lengths `path` does not hold yet."""
    records = load(path)
    held = {(r["corpus"], r["length"]) for r in records}
    records += [r for r in (load(earlier) if earlier else []) if (r["corpus"], r["length"]) not in held]
    if not records:
        return []
    out = ["## Whole units on real files (a PyPI package table, Debian's package log, LiteLLM's price table)", "",
           "`python -m ilre.evaluation.report.real_files` (evaluation/report/real_files.py): windows of real files, one question about "
           "one row or line, the default strategy at budget 1024 with `granularity` token and unit on the same document. "
           "Cells: answer kept % [95% Wilson] / asked line kept whole % (/ the table's header row kept %, where the "
           "file has one); difference: unit minus token in points with its 95% paired-bootstrap interval.", "",
           "Fell back: the samples where the default read the whole context to l_R (its candidates missed), of "
           "those that say; \"not recorded\": measured before the default had its fallback (stages 20-21).", "",
           "| corpus | length | tokens | units | difference | pairs | fell back |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for corpus in sorted({r["corpus"] for r in records}):
        for length in sorted({r["length"] for r in records if r["corpus"] == corpus}):
            by = {g: {r["index"]: r for r in records if r["corpus"] == corpus and r["length"] == length
                      and r["granularity"] == g} for g in ("token", "unit")}
            keys = sorted(set(by["token"]) & set(by["unit"]))
            if not keys:
                continue
            cells = []
            for g in ("token", "unit"):
                kept = sum(by[g][k]["kept"] for k in keys) / len(keys)
                low, high = wilson(kept, len(keys))
                whole = sum(by[g][k]["line_whole"] for k in keys) / len(keys)
                headers = [by[g][k].get("header_kept") for k in keys]
                header = (f" / {100 * sum(headers) / len(keys):.0f}" if all(h is not None for h in headers) else "")
                cells.append(f"{100 * kept:.0f} [{100 * low:.0f}–{100 * high:.0f}] / {100 * whole:.0f}{header}")
            diff, low, high = paired_difference([(float(by["unit"][k]["kept"]), float(by["token"][k]["kept"])) for k in keys])
            said = [by["unit"][k]["fell_back"] for k in keys if by["unit"][k].get("fell_back") is not None]
            fell = f"{sum(said)} of {len(said)}" if said else "not recorded"
            out.append(f"| {corpus} | {length_label(length)} | {cells[0]} | {cells[1]} | "
                       f"{100 * diff:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}] | {len(keys)} | {fell} |")
    return out + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="16K,32K")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--corpora", default=",".join(SOURCES), help="which corpora, in this order")
    args = parser.parse_args()
    corpora = tuple(args.corpora.split(","))
    unknown = sorted(set(corpora) - set(SOURCES))
    if unknown:
        parser.error(f"--corpora: unknown {', '.join(unknown)} (known: {', '.join(SOURCES)})")
    run_real_files([parse_length(n) for n in args.lengths.split(",")], args.samples, corpora=corpora)
    print("\n".join(section(OUTPUT, EARLIER)))


if __name__ == "__main__":
    main()
