"""A context grown by a tool result, sent right after its first reading, in one `ilre batch` run: what the grown line's
prefill costs against the first line's, with the batch's default (`--deepen hold`: the first reading holds its
stream, the grown line takes it on and starts its candidates there) and with `--deepen off` (the grown line takes
the prefix's encoding on but runs its candidates from layer 1, as a fresh engine would), in the same run.

Per pair (Python's pydoc text at --tokens, then the same text plus --added tokens with a fact planted in the new
part; one question for both, as an agent's next step asks): both lines' prefill (ms, the result's timings_ms), the
ratio, the tokens taken on, the fact kept, and the share of the grown line's kept tokens in common with `off`'s.

    .venv/bin/python bench/batch_grown_bench.py [--tokens 16000] [--added 1000] [--pairs 3] [--dtype auto]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ilre.evaluation.tasks.haystack import pydoc_text  # noqa: E402
from ilre.models.embedded import embedded_checkpoint  # noqa: E402
from ilre.models.loader import load_tokenizer  # noqa: E402

ILRE = str(Path(sys.executable).parent / "ilre")
QUERY = "What code did the tool return?"


def pairs(tokens: int, added: int, count: int) -> list[dict]:
    """`count` (first, grown) ilre lines: `tokens` of pydoc text, then `added` more with a fact in the middle."""
    tokenizer = load_tokenizer(embedded_checkpoint())
    ids = tokenizer(pydoc_text(), add_special_tokens=False).input_ids
    step = max(1, (len(ids) - tokens - added) // max(count, 1))
    lines = []
    for i in range(count):
        at = i * step
        first = tokenizer.decode(ids[at:at + tokens])
        more = tokenizer.decode(ids[at + tokens:at + tokens + added])
        half = len(more) // 2
        grown = f"{first}{more[:half]}\nThe tool returned the code {7000 + i}.\n{more[half:]}"
        lines += [{"id": f"first-{i}", "context": first, "query": QUERY},
                  {"id": f"grown-{i}", "context": grown, "query": QUERY}]
    return lines


def run(source: Path, output: Path, deepen: str, dtype: str) -> dict[str, dict]:
    """The real command, one line at a time (each grown line right after its first); its output by id."""
    proc = subprocess.run([ILRE, "batch", "--input", str(source), "--output", str(output), "--in-flight", "1",
                           "--deepen", deepen, "--dtype", dtype], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"ilre batch --deepen {deepen} failed: {proc.stderr[-2000:]}")
    return {line["id"]: line for line in map(json.loads, output.read_text().splitlines())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16000)
    parser.add_argument("--added", type=int, default=1000)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        source = Path(work) / "in.jsonl"
        source.write_text("".join(json.dumps(line) + "\n" for line in pairs(args.tokens, args.added, args.pairs)))
        outputs = {deepen: run(source, Path(work) / f"{deepen}.jsonl", deepen, args.dtype) for deepen in ("hold", "off")}
    print(f"# ilre batch, {args.pairs} pairs: {args.tokens} tokens, then {args.added} more; --dtype {args.dtype}")
    print("| --deepen | pair | first prefill ms | grown prefill ms | grown / first | taken on | fact kept | "
          "kept in common with off |")
    print("|---|---|---|---|---|---|---|---|")
    ratios: dict[str, list[float]] = {}
    for deepen, lines in outputs.items():
        for i in range(args.pairs):
            first, grown = lines[f"first-{i}"], lines[f"grown-{i}"]
            ratio = grown["timings_ms"]["prefill"] / first["timings_ms"]["prefill"]
            ratios.setdefault(deepen, []).append(ratio)
            base = set(outputs["off"][f"grown-{i}"]["kept_indices"])
            common = len(base & set(grown["kept_indices"])) / len(base)
            print(f"| {deepen} | {i} | {first['timings_ms']['prefill']:,.0f} | {grown['timings_ms']['prefill']:,.0f} | "
                  f"{ratio:.3f} | {grown.get('resumed_tokens', 0):,} | {str(7000 + i) in grown['compressed_context']} | "
                  f"{common:.1%} |")
    print("\n" + ", ".join(f"--deepen {d}: grown / first {statistics.median(r):.3f} (median)" for d, r in ratios.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
