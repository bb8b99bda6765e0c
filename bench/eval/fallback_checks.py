"""Checks behind the notes on the default's fallback (stages 22-24), on chosen samples.

A sample is `task:length:index`: a suite task (evaluation/tasks/ruler.py, the structured ones included) or a
real file of evaluation/tasks/real_files.py (pypi_tsv, dpkg_log, litellm_prices).

    # the answer kept under several cascade options, units and tokens, and each request's seconds with nothing
    # cached (one line of JSON per sample)
    .venv/bin/python bench/eval/fallback_checks.py options niah_paraphrase:32K:2 pypi_tsv:32K:4 \\
        --options '{}' '{"deepen_blend": 0.5}' '{"deepen_blend": 1}' '{"deepen_below": 0}' \\
                  '{"candidates": 16, "deepen_below": 0}' '{"candidates": 8, "deepen_below": 0}'
    # layer 8's own peak strength over the whole context
    .venv/bin/python bench/eval/fallback_checks.py coarse-peak niah_paraphrase:16K:0 logs:16K:0
    # end to end, units against tokens, pair by pair: both right, only one right, both wrong, per length
    .venv/bin/python bench/eval/fallback_checks.py e2e-pairs
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import torch

from ilre.compressor.prefill import prefill_query
from ilre.compressor.cascade_reading import peak_strength
from ilre.contract.messages import CompressRequest
from ilre.engine.engine import Engine, EngineConfig
from ilre.evaluation.running.metrics import retention
from ilre.evaluation.running.records import load_records
from ilre.evaluation.tasks.lengths import length_label, parse_length
from ilre.evaluation.tasks.real_files import SOURCES, make_sample
from ilre.evaluation.tasks.ruler import generate_sample
from ilre.kernels.query_scores import query_key_scores


def request_fields(engine: Engine, spec: str) -> tuple[dict, list[str]]:
    """The context and query fields of a CompressRequest for sample `spec`, and its gold answers."""
    task, length, index = spec.split(":")
    if task in SOURCES:
        lines = [l for l in SOURCES[task].read_text(errors="replace").splitlines() if l.strip()]
        sample = make_sample(engine.tokenizer, task, lines, parse_length(length), int(index))
        return {"context": sample["context"], "query": sample["query"]}, [sample["answer"]]
    sample = generate_sample(engine.tokenizer, task, parse_length(length), 0, int(index))
    return {"context_ids": sample.context_ids, "query_ids": sample.query_ids}, sample.answers


def options(specs: list[str], option_sets: list[dict], budget: int) -> None:
    engine = Engine(EngineConfig(doc_cache_mb=0))  # every request pays its whole cost, so its seconds compare
    for spec in specs:
        fields, answers = request_fields(engine, spec)
        row = {"sample": spec}
        for opts in option_sets:
            for granularity in ("unit", "token"):
                tick = time.perf_counter()
                result = engine.compress(CompressRequest(**fields, budget=budget, strategy_options=opts,
                                                         granularity=granularity))
                row[f"{json.dumps(opts)} {granularity}"] = retention(result.compressed_context, answers)
                row[f"{json.dumps(opts)} {granularity} s"] = round(time.perf_counter() - tick, 1)
                row[f"{json.dumps(opts)} fell back"] = result.fell_back
        print(json.dumps(row), flush=True)


def coarse_peak(specs: list[str], budget: int) -> None:
    engine = Engine(EngineConfig(doc_cache_mb=0))
    for spec in specs:
        fields, _ = request_fields(engine, spec)
        job = engine.prepare(CompressRequest(**fields, budget=budget))
        coarse = job.strategy.coarse_layer
        with torch.inference_mode():
            retrieval = prefill_query(job.model, engine.encode(job), job.queries[0])
            scores = query_key_scores(retrieval.queries[coarse], retrieval.keys[coarse])
        print(json.dumps({"sample": spec, "coarse_peak": round(peak_strength(scores[job.prefill.sink:]), 4)}), flush=True)


def e2e_pairs(raw: Path) -> None:
    pairs: dict[tuple, dict[str, float]] = {}
    for r in load_records(raw):
        if r["strategy"] in ("cascade", "cascade_units") and r.get("e2e") is not None and r["budget"] == 1024:
            pairs.setdefault((r["task"], r["length"], r["index"], r["seed"]), {})[r["strategy"]] = r["e2e"]
    counts = Counter((key[1], both["cascade_units"] > 0, both["cascade"] > 0)
                     for key, both in pairs.items() if len(both) == 2)
    for length in sorted({length for length, _, _ in counts}):
        c = {k[1:]: n for k, n in counts.items() if k[0] == length}
        print(f"{length_label(length)}: {sum(c.values())} pairs; both right {c.get((True, True), 0)}, only units "
              f"{c.get((True, False), 0)}, only tokens {c.get((False, True), 0)}, both wrong {c.get((False, False), 0)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="check", required=True)
    for name in ("options", "coarse-peak"):
        p = sub.add_parser(name)
        p.add_argument("samples", nargs="+", help="task:length:index")
        p.add_argument("--budget", type=int, default=1024)
        if name == "options":
            p.add_argument("--options", nargs="+", type=json.loads, default=[{}], help="one JSON object per option set")
    p = sub.add_parser("e2e-pairs")
    p.add_argument("--raw", type=Path, default=Path("results/eval/raw.jsonl"))
    args = parser.parse_args()
    if args.check == "options":
        options(args.samples, args.options, args.budget)
    elif args.check == "coarse-peak":
        coarse_peak(args.samples, args.budget)
    else:
        e2e_pairs(args.raw)


if __name__ == "__main__":
    main()
