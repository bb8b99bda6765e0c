"""`make bench`: what keeping whole units costs (granularity "unit" against "token").

1. Segmentation alone (compressor/units.py over the tokens' bytes, models/token_bytes.py) at 32K, 128K
   and 1M tokens of three texts: Shakespeare (sentences and verse lines), JSON Lines tool output
   (records, brackets, strings) and one line with no structure (windows): the median of 3 runs.
2. The default strategy on one Shakespeare haystack with a passkey at 50% depth, budget 1024,
   `--dtype auto`, no document cache (so every request segments its context afresh, the worst case:
   a cached document keeps its units), at 32K and 128K: token and unit requests alternate in one
   process after a warm-up of each, `--repeats` of each, medians and their ratio; the needle kept?
Usage: bench/units_bench.py [--lengths 32768,131072] [--repeats 3] [--output results/bench/units.txt]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

SEGMENT_LENGTHS = (32768, 131072, 1 << 20)
TARGET_RATIO, TARGET_1M_S = 1.05, 2.0


def texts(tokenizer, length: int) -> dict[str, torch.Tensor]:
    """(length,) IDs of each kind of text: built, tokenized once and repeated to the length."""
    from ilre.evaluation.tasks.haystack import shakespeare_text

    rng = random.Random(0)
    records = "\n".join(json.dumps({"id": f"job-{k:06d}", "status": rng.choice(["ok", "failed", "pending"]),
                                    "owner": rng.choice(["ops", "web", "data"]), "note": "retry, then page",
                                    "latency_ms": rng.randrange(10**6)}) for k in range(4000))
    table = "id,status,owner,latency_ms,bytes\n" + "".join(
        f"job-{k:06d},{rng.choice(['ok', 'failed'])},{rng.choice(['ops', 'web'])},{rng.randrange(10**6)},{rng.randrange(10**9)}\n"
        for k in range(4000))
    sources = {"shakespeare": shakespeare_text()[:2_000_000], "json lines": records, "csv table": table,
               "one line": "lorem ipsum dolor " * 20000}
    out = {}
    for name, text in sources.items():
        ids = torch.tensor(tokenizer(text, add_special_tokens=False).input_ids, dtype=torch.int64)
        out[name] = ids.repeat(length // ids.numel() + 1)[:length]
    return out


def segmentation_rows(tokenizer) -> list[dict]:
    from ilre.compressor.units import document_units
    from ilre.models.token_bytes import context_bytes, token_bytes

    table = token_bytes(tokenizer)
    rows = []
    for length in SEGMENT_LENGTHS:
        for kind, ids in texts(tokenizer, length).items():
            times, units = [], 0
            for _ in range(3):
                start = time.perf_counter()
                bounds = document_units(context_bytes(table, ids)).bounds
                times.append(time.perf_counter() - start)
                units = bounds.numel() - 1
            rows.append({"text": kind, "tokens": length, "seconds": statistics.median(times), "units": units})
            print(f"segmentation {kind:12} {length:8d} tokens: {rows[-1]['seconds']:.3f} s, {units} units", flush=True)
    return rows


def compress_rows(lengths: list[int], repeats: int) -> list[dict]:
    from ilre.engine.engine import Engine, EngineConfig
    from ilre.contract.messages import CompressRequest
    from ilre.evaluation.tasks.passkey import make_passkey_sample

    engine = Engine(EngineConfig(doc_cache_mb=0))
    rows = []
    for length in lengths:
        sample = make_passkey_sample(engine.tokenizer, length, 0.5, seed=7)
        seconds: dict[str, list[float]] = {"token": [], "unit": []}
        kept = {"token": True, "unit": True}
        for granularity in ("token", "unit"):  # warm-up: the layers loaded, the allocator at its steady state
            engine.compress(CompressRequest(context_ids=sample.context_ids, query_ids=sample.query_ids, budget=1024,
                                            granularity=granularity))
        for _ in range(repeats):
            for granularity in ("token", "unit"):
                start = time.perf_counter()
                result = engine.compress(CompressRequest(context_ids=sample.context_ids, query_ids=sample.query_ids,
                                                         budget=1024, granularity=granularity))
                seconds[granularity].append(time.perf_counter() - start)
                kept[granularity] &= sample.passkey in result.compressed_context
        token, unit = statistics.median(seconds["token"]), statistics.median(seconds["unit"])
        rows.append({"tokens": len(sample.context_ids), "token_s": token, "unit_s": unit, "ratio": unit / token,
                     "needle_token": kept["token"], "needle_unit": kept["unit"], "runs": seconds})
        print(f"default at {len(sample.context_ids)} tokens: token {token:.2f} s, unit {unit:.2f} s ({unit / token:.3f}x)",
              flush=True)
    return rows


def report(segments: list[dict], compresses: list[dict]) -> str:
    lines = ["| text         |  context | segmentation s | units | tokens per unit |"]
    for r in segments:
        lines.append(f"| {r['text']:12} | {r['tokens']:8d} | {r['seconds']:14.3f} | {r['units']:5d} | "
                     f"{r['tokens'] / max(r['units'], 1):15.1f} |")
    worst_1m = max(r["seconds"] for r in segments if r["tokens"] == 1 << 20)
    lines += [f"segmentation at 1M tokens: at most {worst_1m:.2f} s (target < {TARGET_1M_S:.0f} s)", "",
              "| context | default, tokens s | default, units s | units / tokens | needle (tokens, units) |"]
    for r in compresses:
        lines.append(f"| {r['tokens']:7d} | {r['token_s']:17.2f} | {r['unit_s']:16.2f} | {r['ratio']:13.3f}x | "
                     f"{'kept' if r['needle_token'] else 'LOST'}, {'kept' if r['needle_unit'] else 'LOST'} |")
    worst = max((r["ratio"] for r in compresses), default=0.0)
    lines.append(f"units cost at most {worst:.3f}x tokens (target <= {TARGET_RATIO}x), no document cache: every request segments")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="32768,131072")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default="results/bench/units.txt")
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    from ilre.models.embedded import embedded_checkpoint
    from ilre.models.loader import load_tokenizer

    segments = segmentation_rows(load_tokenizer(embedded_checkpoint()))
    compresses = compress_rows([int(n) for n in args.lengths.split(",")], args.repeats)
    text = report(segments, compresses)
    print(text)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in segments + compresses))


if __name__ == "__main__":
    main()
