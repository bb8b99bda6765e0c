"""A first question's candidates from the coarse pass's stream, against the same pass from layer 1.

The default cascade runs a document's first question's candidates on from the residual stream its coarse pass left
entering layer 8 (`first_from_stream`, on where the servers and `ilre batch` hold streams), where it used to run
them from layer 1 again. This prints, on the evaluation's RULER-style tasks (`ilre eval`'s generator, seeds it does
not use), per length:
- what each path keeps of the answers (the evaluation's retention on the kept text), and plain ILRe at l_R with the
  coarse layer blended (what a deepened document answers: the limit both approximate) beside them;
- how much of the budget the two paths share, and each one's share with that deep reading;
- each path's seconds, and plain ILRe at the coarse layer's (the cost target: the default <= 1.25x it).

One engine as `ilre batch` runs (streams held, no document cache kept between requests), the paths alternating per
sample. Each finished request is a line of `--output` (JSON), and a rerun with the same output goes on from there.

    .venv/bin/python bench/first_stream_bench.py [--lengths 16384,32768] [--samples 1] [--tasks all]
        [--output results/bench/first_stream.jsonl] [--report-only]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

PATHS = ("stream", "layer1", "deep", "fast")  # the default; from layer 1; l_R over all (coarse blended); layer 8
SEED = 9100  # the evaluation's runs use seeds 0..; these samples are not among them


def request_for(path: str, profile) -> dict:
    """The request options of one path."""
    if path == "stream":
        return {}
    if path == "layer1":
        return {"strategy_options": {"first_from_stream": False}}
    if path == "fast":
        return {"strategy": "ilre", "layer": "fast"}
    options = profile.strategy_options("cascade")
    return {"strategy": "ilre", "strategy_options": {"also_layers": [options["coarse_layer"]],
                                                     "also_weight": options.get("coarse_weight", 0.5)}}


def run(args: argparse.Namespace) -> None:
    import torch

    from ilre.engine.engine import Engine, EngineConfig
    from ilre.contract.messages import CompressRequest
    from ilre.evaluation.running.metrics import retention
    from ilre.evaluation.tasks.ruler import TASKS, generate_sample

    done = {(r["task"], r["length"], r["index"], r["path"]) for r in load(args.output)}
    engine = Engine(EngineConfig(doc_cache_mb=0, hold_streams=True, dtype=args.dtype))
    print(f"engine: {engine.placement.dtype_name}, {torch.get_num_threads()} threads", file=sys.stderr)
    tasks = list(TASKS) if args.tasks == "all" else args.tasks.split(",")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("a") as out:
        for length in args.lengths:
            for task in tasks:
                for index in range(args.samples):
                    paths = [p for p in PATHS if (task, length, index, p) not in done]
                    if not paths:
                        continue
                    sample = generate_sample(engine.tokenizer, task, length, SEED, index)
                    for path in paths:
                        asked = CompressRequest(context_ids=sample.context_ids, query_ids=sample.query_ids,
                                                budget=args.budget, **request_for(path, engine.profile))
                        result = engine.compress(asked)
                        kept = result.kept_indices
                        text = engine.tokenizer.decode([sample.context_ids[i] for i in kept])
                        row = {"task": task, "length": length, "index": index, "path": path,
                               "tokens": len(sample.context_ids), "kept": kept, "seconds": result.timings_ms["total"] / 1000,
                               "retention": retention(text, sample.answers), "dtype": engine.placement.dtype_name}
                        out.write(json.dumps(row) + "\n")
                        out.flush()
                        print(f"{length} {task} {index} {path}: {row['seconds']:.2f} s, retention {row['retention']:.2f}",
                              file=sys.stderr)


def load(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def report(rows: list[dict], budget: int) -> None:
    """Per length: retention per path, budget shared between paths, seconds."""
    by: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        by.setdefault((r["length"], r["task"], r["index"]), {})[r["path"]] = r
    for length in sorted({key[0] for key in by}):
        cases = [paths for key, paths in by.items() if key[0] == length and all(p in paths for p in PATHS)]
        if not cases:
            continue

        def share(a: str, b: str) -> list[float]:
            return [len(set(c[a]["kept"]) & set(c[b]["kept"])) / len(c[a]["kept"]) for c in cases]

        def mean(values: list[float]) -> str:
            return f"{100 * statistics.fmean(values):.1f}%"

        print(f"\n{length} tokens, {len(cases)} samples ({len({c['stream']['task'] for c in cases})} tasks), "
              f"budget {budget}, {cases[0]['stream']['dtype']}:")
        print("| path | retention | budget shared with the deep reading | seconds (median) | x plain ILRe at layer 8 |")
        print("|---|---|---|---|---|")
        fast = statistics.median(c["fast"]["seconds"] for c in cases)
        names = {"stream": "default, candidates from the stream", "layer1": "default, candidates from layer 1",
                 "deep": "plain ILRe at l_R, layer 8 blended", "fast": "plain ILRe at layer 8"}
        for path in PATHS:
            seconds = statistics.median(c[path]["seconds"] for c in cases)
            shared = mean(share(path, "deep")) if path != "deep" else "-"
            print(f"| {names[path]} | {mean([c[path]['retention'] for c in cases])} | {shared} | {seconds:.2f} "
                  f"| {seconds / fast:.2f}x |")
        differ = [(c["stream"]["task"], c["stream"]["retention"], c["layer1"]["retention"]) for c in cases
                  if c["stream"]["retention"] != c["layer1"]["retention"]]
        print(f"the two first-question paths share {mean(share('stream', 'layer1'))} of the budget; retention differs "
              f"in {len(differ)} of {len(cases)}: " + (", ".join(f"{t} {a:.2f} vs {b:.2f}" for t, a, b in differ) or "none"))
        saved = sorted(c["layer1"]["seconds"] - c["stream"]["seconds"] for c in cases)
        print(f"paired per sample, the stream path took {statistics.median(saved):.2f} s less (median; "
              f"{saved[0]:.2f} to {saved[-1]:.2f})")
        pairs = list(zip(share("stream", "deep"), share("layer1", "deep")))
        closer, further = sum(a > b for a, b in pairs), sum(a < b for a, b in pairs)
        print(f"against the deep reading the stream path is closer in {closer} of {len(cases)} samples, further in "
              f"{further}, as close in {len(cases) - closer - further}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="16384,32768")
    parser.add_argument("--samples", type=int, default=1)
    parser.add_argument("--tasks", default="all")
    parser.add_argument("--budget", type=int, default=1024)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--output", type=Path, default=ROOT / "results/bench/first_stream.jsonl")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    args.lengths = [int(x) for x in args.lengths.split(",") if x]
    if not args.report_only:
        run(args)
    report(load(args.output), args.budget)


if __name__ == "__main__":
    main()
