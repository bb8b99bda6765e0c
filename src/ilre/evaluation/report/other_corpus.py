"""The default checked beyond the suite's own haystacks: passkeys in Python's reference documentation, the
results page's section on them and the command that measures them.

Each sample: a haystack of Python's `pydoc_data` topics (text no other stage uses) with one passkey
phrase and `distractors` others (the calibration's long grid, multikey-style), the needle at one of
`depths` equal segments. The default (the cascade), plain ILRe at its coarse layer and plain ILRe at
l_R each compress it as a request to the engine (budget 1024, DCA `auto`; evaluation/running/other_corpus.py);
a record says whether the whole needle phrase was kept.

    python -m ilre.evaluation.report.other_corpus [--lengths 16K,32K] [--depths 10] [--distractors 100]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..running.other_corpus import OUTPUT, load, run_other_corpus
from ..tasks.lengths import length_label
from .intervals import paired_difference, wilson


def section(path: Path) -> list[str]:
    """Markdown lines for the results page: needle kept per strategy and length, and the default against
    plain ILRe at l_R on the same samples."""
    records = load(path)
    if not records:
        return []
    names = sorted({r["strategy"] for r in records}, key=lambda n: (n != "cascade", n))
    lengths = sorted({r["length"] for r in records})
    l_r = max(int(n.split("@")[1]) for n in names if n.startswith("ilre@"))
    out = ["## Beyond the suite's haystacks: passkeys in Python's reference documentation", "",
           f"Haystacks of Python's own reference topics (`pydoc_data`, shipped with the interpreter; no other stage uses "
           f"them), one passkey phrase among {records[0]['distractors']} others, budget {records[0]['budget']}, "
           "the needle at equal depths (`python -m ilre.evaluation.report.other_corpus`). Each cell: the whole needle phrase "
           "kept, % [95% Wilson interval] (samples).", "",
           "| strategy | " + " | ".join(length_label(n) for n in lengths) + " |", "| --- |" + " ---: |" * len(lengths)]
    for name in names:
        cells = []
        for n in lengths:
            hits = [float(r["kept"]) for r in records if r["strategy"] == name and r["length"] == n]
            if not hits:
                cells.append("–")
                continue
            mean = sum(hits) / len(hits)
            low, high = wilson(mean, len(hits))
            cells.append(f"{100 * mean:.0f} [{100 * low:.0f}-{100 * high:.0f}] ({len(hits)})")
        label = "the default (cascade)" if name == "cascade" else f"plain ILRe at layer {name.split('@')[1]}"
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    out.append("")
    for n in lengths:
        at = {(r["strategy"], r["depth"]): float(r["kept"]) for r in records if r["length"] == n}
        pairs = [(at["cascade", d], at[f"ilre@{l_r}", d]) for s, d in at if s == "cascade" and (f"ilre@{l_r}", d) in at]
        if pairs:
            mean, low, high = paired_difference(pairs)
            out.append(f"- {length_label(n)}: the default minus plain ILRe at layer {l_r}: {100 * mean:+.1f} points "
                       f"[{100 * low:+.1f}, {100 * high:+.1f}] on {len(pairs)} paired samples.")
    return out + [""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="16K,32K")
    parser.add_argument("--depths", type=int, default=10)
    parser.add_argument("--distractors", type=int, default=100)
    parser.add_argument("--output", default=str(OUTPUT))
    args = parser.parse_args(argv)
    lengths = [int(x[:-1]) * 1024 if x.upper().endswith("K") else int(x) for x in args.lengths.split(",") if x]
    run_other_corpus(lengths, args.depths, args.distractors, Path(args.output),
                     progress=lambda line: print(line, file=sys.stderr, flush=True))
    print("\n".join(section(Path(args.output))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
