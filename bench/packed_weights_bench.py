"""bfloat16 weights packed once for oneDNN (models/packed_linear.py) against plain weights packed by every product.

1. Each of a layer's four products (the embedded model: D 576, F 1536, q/k/v 960) at a query's rows (1, 34), a short
   line's (700) and a prefill chunk's (1024): best of 30 calls each way, and the share of elements equal.
2. End to end, one engine, its layers switched between packed and plain weights (unpack_linears / pack_linears),
   alternating on fresh contexts (no document cache): a first question over --tokens (passkey, budget 1024) by the
   default and by plain ILRe at l_R, and --lines short lines (~700 tokens, ratio 0.3, as bench/short_lines_bench.py
   sends them): median seconds, and the share of kept tokens both ways keep.
3. Memory: the resident set of a fresh process that loaded the engine, then after one short line, each way.

    .venv/bin/python bench/packed_weights_bench.py [--tokens 32768] [--repeats 3] [--lines 24]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from layer_passes_bench import first_questions, short_requests, shared, timed  # noqa: E402
from stage_limits import best_s  # noqa: E402

SHAPES = {"q/k/v": (576, 960), "o": (576, 576), "gate/up": (576, 3072), "down": (1536, 576)}


def micro() -> None:
    """Each product both ways, ms per call."""
    import torch
    import torch.nn.functional as F

    from ilre.models.packed_linear import PackedLinear

    gen = torch.Generator().manual_seed(0)
    print("| product | rows | plain ms | packed ms | speed-up | packed GFLOP/s | elements equal |")
    print("|---|---|---|---|---|---|---|")
    for name, (k, n) in SHAPES.items():
        linear = torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16).requires_grad_(False)
        linear.weight.copy_(torch.randn(n, k, generator=gen))
        packed = PackedLinear(linear)
        for rows in (1, 34, 700, 1024):
            x = torch.randn(rows, k, generator=gen).bfloat16()
            a = best_s(lambda: F.linear(x, linear.weight), 30)
            b = best_s(lambda: packed(x), 30)
            equal = (packed(x) == F.linear(x, linear.weight)).float().mean().item()
            print(f"| {name} | {rows} | {a * 1e3:.3f} | {b * 1e3:.3f} | {a / b:.2f}x | "
                  f"{2 * rows * k * n / b / 1e9:.0f} | {equal:.2%} |", flush=True)


def switch(engine, packed: bool) -> None:
    """Every loaded model of `engine` with packed weights, or plain."""
    import torch

    from ilre.models.packed_linear import pack_linears, unpack_linears

    for model in engine._models.values():
        if packed:
            pack_linears(model, torch.bfloat16, torch.device("cpu"))
        else:
            unpack_linears(model)


def end_to_end(args) -> None:
    from ilre.engine.engine import Engine, EngineConfig
    from ilre.contract.messages import CompressRequest

    engine = Engine(EngineConfig(dtype="bfloat16", doc_cache_mb=0))
    sample, jobs = first_questions(engine, args.tokens)
    lines = short_requests(args.lines)
    ways = {"plain": lambda: switch(engine, False), "packed": lambda: switch(engine, True)}
    for strategy in ({}, {"strategy": "ilre"}):  # loads every model the requests use (switch() swaps loaded ones)
        engine.compress(CompressRequest(context_ids=sample.context_ids[:4096], query_ids=sample.query_ids,
                                        budget=1024, **strategy))
    engine.compress(lines[0])
    print(f"\n{args.tokens} tokens, {engine.placement.describe()}, the two ways alternating, {args.repeats} runs each")
    print("| request | plain weights (median) | packed weights (median) | speed-up | kept tokens shared |")
    print("|---|---|---|---|---|")
    for name, request in jobs.items():
        times, kept = timed(engine, [request], args.repeats, ways)
        a, b = statistics.median(times["plain"]), statistics.median(times["packed"])
        print(f"| {name} | {a:.2f} s | {b:.2f} s | {a / b:.2f}x | {shared(kept, 'packed', 'plain'):.1%} |", flush=True)
    times, kept = timed(engine, lines, args.repeats, ways)
    a, b = statistics.median(times["plain"]), statistics.median(times["packed"])
    print(f"| a short line (~700 tokens, ratio 0.3), of {args.lines} | {a * 1e3:.0f} ms | {b * 1e3:.0f} ms | "
          f"{a / b:.2f}x | {shared(kept, 'packed', 'plain'):.1%} |")


def resident_mib(packed: bool) -> tuple[float, float]:
    """VmRSS (MiB) of a fresh process that loaded a bfloat16 engine (packed or plain weights), then after it
    compressed a short line and gave the freed heap back (engine/heap.py)."""
    code = (
        "import sys, json; sys.path.insert(0, %r)\n"
        "import ilre.models.loader as loader\n"
        "if not %r: loader.pack_linears = lambda model, dtype, device: model\n"
        "from layer_passes_bench import short_requests\n"
        "from ilre.engine.engine import Engine, EngineConfig\n"
        "rss = lambda: int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1]) / 1024\n"
        "engine = Engine(EngineConfig(dtype='bfloat16', doc_cache_mb=0))\n"
        "loaded = rss()\n"
        "engine.compress(short_requests(1)[0])\n"
        "engine.heap.after_work(force=True)\n"
        "print(json.dumps([loaded, rss()]))\n"
    ) % (str(Path(__file__).resolve().parent), packed)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return tuple(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lines", type=int, default=24)
    args = parser.parse_args()
    import torch

    from ilre.models.packed_linear import packing_applies

    if not packing_applies(torch.bfloat16, torch.device("cpu")):
        print("this CPU's oneDNN has no native bfloat16: weights are never packed here (nothing to compare)")
        return
    micro()
    print(f"({torch.get_num_threads()} threads)")
    end_to_end(args)
    plain, packed = resident_mib(False), resident_mib(True)
    print(f"\nresident set of a fresh process, loaded: plain weights {plain[0]:.0f} MiB, packed {packed[0]:.0f} MiB; "
          f"after a short line (freed heap returned): {plain[1]:.0f} MiB, {packed[1]:.0f} MiB")


if __name__ == "__main__":
    main()
