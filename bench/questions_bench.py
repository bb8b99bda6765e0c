"""`make bench`: does sharing a candidate pass cost a question its answer? Several questions in one request.

For each kind of content of the mixed-content bench (bench/mixed_bench.py: RULER needles, the structured
records, Python's language reference), one text at `--length` tokens is asked its own question alone, then in
one request together with the questions of the `--others` next kinds (questions about content that is not in
the text, so their candidates land elsewhere and the shared pass grows). Default strategy, budget 1024,
`--dtype auto`, no document cache. Per text: the own question's answer kept alone / together, both requests'
`timings_ms.total`, and whether the together request read the whole context to l_R (`fell_back`). Records go
one per line to `--output` as they are measured: a stopped run resumes, a finished one only reprints.
Usage: bench/questions_bench.py [--length 16384] [--others 4] [--output results/bench/questions.jsonl]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mixed_bench import KINDS, sample


def kept(result, answers: list[str]) -> bool:
    text = " ".join(result.compressed_context.split())
    return all(" ".join(a.split()) in text for a in answers)


def run(length: int, others: int, output: Path) -> list[dict]:
    from ilre.engine.engine import Engine, EngineConfig
    from ilre.contract.messages import CompressRequest

    done = [json.loads(line) for line in output.read_text().splitlines()] if output.exists() else []
    have = {(r["tokens"], r["kind"], r["others"]) for r in done}
    todo = [kind for kind in KINDS if (length, kind, others) not in have]
    if not todo:
        return done
    engine = Engine(EngineConfig(doc_cache_mb=0))
    samples = {kind: sample(engine.tokenizer, kind, length, 0) for kind in KINDS}
    engine.compress(CompressRequest(context_ids=samples[KINDS[0]][0], query_ids=samples[KINDS[0]][1], budget=1024))
    output.parent.mkdir(parents=True, exist_ok=True)
    for kind in todo:
        ids, query, answers = samples[kind]
        start = KINDS.index(kind)
        asked = [query] + [samples[KINDS[(start + k) % len(KINDS)]][1] for k in range(1, others + 1)]
        alone = engine.compress(CompressRequest(context_ids=ids, query_ids=query, budget=1024))
        together = engine.compress(CompressRequest(context_ids=ids, queries_ids=asked, budget=1024)).results[0]
        row = {"tokens": length, "kind": kind, "others": others, "context_tokens": len(ids),
               "alone_kept": kept(alone, answers), "together_kept": kept(together, answers),
               "alone_s": round(alone.timings_ms["total"] / 1000, 3), "together_s": round(together.timings_ms["total"] / 1000, 3),
               "fell_back": together.fell_back, "same": alone.kept_indices == together.kept_indices,
               "placement": engine.placement.describe()}
        done.append(row)
        with output.open("a") as out:
            out.write(json.dumps(row) + "\n")
        print(f"  {kind}: alone {row['alone_s']:.1f} s {'kept' if row['alone_kept'] else 'lost'}, together "
              f"{row['together_s']:.1f} s {'kept' if row['together_kept'] else 'lost'}", file=sys.stderr, flush=True)
    return done


def report(rows: list[dict]) -> list[str]:
    lines = []
    for length, others in sorted({(r["tokens"], r["others"]) for r in rows}):
        group = [r for r in rows if (r["tokens"], r["others"]) == (length, others)]
        lines += [f"{length} tokens, each text's question alone and with {others} other questions in one request "
                  f"({group[0]['placement']}):", "",
                  "| content | answer kept alone | together | alone s | together s | together / alone | read to l_R |",
                  "|---|---|---|---|---|---|---|"]
        for r in group:
            lines.append(f"| {r['kind']} | {'yes' if r['alone_kept'] else 'no'} | {'yes' if r['together_kept'] else 'no'} "
                         f"| {r['alone_s']:.1f} | {r['together_s']:.1f} | {r['together_s'] / r['alone_s']:.2f}x "
                         f"| {'yes' if r['fell_back'] else 'no'} |")
        alone, together = sum(r["alone_kept"] for r in group), sum(r["together_kept"] for r in group)
        lines += ["", f"answers kept: {alone}/{len(group)} alone, {together}/{len(group)} together; the same tokens "
                  f"kept in {sum(r['same'] for r in group)} of {len(group)}; {1 + others} questions cost "
                  f"{sum(r['together_s'] for r in group) / sum(r['alone_s'] for r in group):.2f}x one in all", ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--others", type=int, default=4, help="questions about other content asked with each text's own")
    parser.add_argument("--output", default="results/bench/questions.jsonl")
    parser.add_argument("--report-only", action="store_true", help="print what the output holds, measure nothing")
    args = parser.parse_args()
    output = Path(args.output)
    rows = ([json.loads(line) for line in output.read_text().splitlines()] if output.exists() else []) \
        if args.report_only else run(args.length, args.others, output)
    text = "\n".join(report(rows))
    print(text)
    output.with_suffix(".txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
