"""The record cap of whole units, measured on the service's own path: for each sample, one compression with
`granularity` token (which encodes the document), then the unit selection redone on the cached encode with
the units cut at each record cap (compressor/units.py `record_tokens`; 48 = no larger cap for records).

    python -m ilre.evaluation.record_caps [--tasks records_json,records_jsonl] [--lengths 4K,16K,32K]
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
    args = parser.parse_args()

    import torch

    from ..compressor.defaults import UNIT_TOKENS
    from ..compressor.units import unit_bounds
    from ..engine.engine import Engine, EngineConfig
    from ..engine.messages import CompressRequest
    from ..models.token_bytes import context_bytes, token_bytes
    from .metrics import retention
    from .ruler import generate_sample, length_label, parse_length

    engine = Engine(EngineConfig())
    table = token_bytes(engine.tokenizer)
    caps = [UNIT_TOKENS] + [int(c) for c in args.caps.split(",")]
    totals: dict[tuple, list[float]] = defaultdict(list)
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    for task in args.tasks.split(","):
        for length in map(parse_length, args.lengths.split(",")):
            for index in range(args.samples):
                sample = generate_sample(engine.tokenizer, task, length, 0, index)
                first = engine.compress(CompressRequest(context=sample.context, query=sample.query, granularity="token"))
                row = {"task": task, "length": length, "index": index, "token": retention(first.compressed_context, sample.answers)}
                ids = torch.tensor(engine.tokenizer(sample.context, add_special_tokens=False).input_ids)
                layout = context_bytes(table, ids)
                for cap in caps:
                    bounds = unit_bounds(layout, UNIT_TOKENS, cap)
                    engine.units = lambda slot, context_ids, b=bounds: b  # this cap's units for the next request
                    again = engine.compress(CompressRequest(document_id=first.document_id, query=sample.query,
                                                            granularity="unit"))
                    row[f"unit{cap}"] = retention(again.compressed_context, sample.answers)
                del engine.units
                engine.documents.clear()
                with OUTPUT.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                for name, value in row.items():
                    if name.startswith(("token", "unit")):
                        totals[task, length, name].append(value)
    for (task, length, name), values in sorted(totals.items()):
        print(f"{task} {length_label(length)} {name}: {100 * sum(values) / len(values):.0f}% ({len(values)})")


if __name__ == "__main__":
    main()
