"""The record cap of whole units, measured on the service's own path: for each sample, one compression with
`granularity` token (which encodes the document), then the unit selection redone on the cached encode with
the units cut at each record cap (compressor/units.py `record_tokens`; 48 = no larger cap for records).
Tasks: the suite's (evaluation/tasks/ruler.py) and `litellm_prices`, the real price table of evaluation/tasks/real_files.py.

    python -m ilre.evaluation.running.record_caps [--tasks records_json,records_jsonl] [--lengths 4K,16K,32K]
                                                  [--samples 10] [--caps 128,160,256]

Appends one JSON line per sample to results/eval/record_caps.jsonl (the answer kept, 1 or 0, per row) and
prints the retention per task, length and cap.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

OUTPUT = Path("results/eval/record_caps.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="records_json,records_jsonl")
    parser.add_argument("--lengths", default="4K,16K,32K")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--caps", default="128,160,256")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()

    import torch

    from ...compressor.defaults import UNIT_TOKENS
    from ...compressor.units import Units, unit_bounds
    from ...engine.engine import Engine, EngineConfig
    from ...contract.messages import CompressRequest
    from ...models.token_bytes import context_bytes, token_bytes
    from .metrics import retention
    from ..tasks.lengths import length_label, parse_length
    from ..tasks.real_files import SOURCES, make_sample
    from ..tasks.ruler import generate_sample

    engine = Engine(EngineConfig())
    table = token_bytes(engine.tokenizer)
    prices = [line for line in SOURCES["litellm_prices"].read_text().splitlines() if line.strip()] \
        if "litellm_prices" in args.tasks and SOURCES["litellm_prices"].is_file() else []

    def case(task: str, length: int, index: int) -> tuple[str, str, list[str]] | None:
        """(context, query, answers) of a suite task, or of the real price table (None: no question there)."""
        if task == "litellm_prices":
            real = make_sample(engine.tokenizer, task, prices, length, index) if prices else None
            return (real["context"], real["query"], [real["answer"]]) if real else None
        sample = generate_sample(engine.tokenizer, task, length, 0, index)
        return sample.context, sample.query, sample.answers

    caps = [UNIT_TOKENS] + [int(c) for c in args.caps.split(",")]
    totals: dict[tuple, list[float]] = defaultdict(list)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    for task in args.tasks.split(","):
        for length in map(parse_length, args.lengths.split(",")):
            for index in range(args.samples):
                sample = case(task, length, index)
                if sample is None:
                    continue
                context, query, answers = sample
                first = engine.compress(CompressRequest(context=context, query=query, granularity="token"))
                row = {"task": task, "length": length, "index": index,
                       "token": retention(first.compressed_context, answers)}
                ids = torch.tensor(engine.tokenizer(context, add_special_tokens=False).input_ids)
                layout = context_bytes(table, ids)
                for cap in caps:
                    bounds = unit_bounds(layout, UNIT_TOKENS, cap)
                    engine.units = lambda slot, context_ids, b=bounds: Units(b)  # this cap's units for the next request
                    again = engine.compress(CompressRequest(document_id=first.document_id, query=query,
                                                            granularity="unit"))
                    row[f"unit{cap}"] = retention(again.compressed_context, answers)
                del engine.units
                engine.documents.clear()
                with args.output.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                for name, value in row.items():
                    if name.startswith(("token", "unit")):
                        totals[task, length, name].append(value)
    for (task, length, name), values in sorted(totals.items()):
        print(f"{task} {length_label(length)} {name}: {100 * sum(values) / len(values):.0f}% ({len(values)})")


if __name__ == "__main__":
    main()
