"""`make bench`: the default strategy (the cascade) beside plain ILRe at its coarse layer and at l_R.

One Shakespeare haystack with a passkey at 50% depth per length, budget 1024, `--dtype auto`; every
measurement in its own process, after the same request once as a warm-up (it loads the layers the
strategy needs, and the allocator's first-run growth is not counted). Memory is the peak RSS beyond
the loaded, warmed-up engine (VmHWM reset through /proc/self/clear_refs before each run), so it is what
the request itself holds: the IDs, the key cache, the working set. One reading of a 32K request swings
by 30-60 MiB with the allocator, so the comparison rows repeat the measured request (`--repeats`) and
report the median seconds and the median peak, with the peaks' range. RSS also counts pages the
allocator keeps after a free, so one more run, profiled, gives what the request's tensors themselves
peak at (the sum of live tensor bytes over time, torch's profiler): deterministic, and the number the
memory target is judged on. Then the default alone from 8K
to 1M tokens (one run each): is its time linear in the length (R^2 of a least-squares line)? And the
default when its candidates miss (`deepen_below` 1: the whole context read to l_R after the candidate
pass, as a query whose candidates l_R attends to weakly is answered), beside the default and l_R.
Usage: bench/default_bench.py [--lengths 32768,131072] [--repeats 3] [--dtype auto] [--linear 8192,...,1048576] [--missed 32768]
                              [--output results/bench/default.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

# (strategy, profile layer name); cascade_layer1: the default with its first question's candidates from layer 1, as
# `--deepen off` runs it (the served default runs them on from its coarse stream, held for deepening)
KINDS = (("cascade", None), ("cascade_layer1", None), ("ilre", "fast"), ("ilre", "default"))
TARGET_COST, TARGET_128K_S, TARGET_MEMORY = 1.3, 45.0, 1.10


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as status:
        return int(next(l for l in status if l.startswith(field + ":")).split()[1]) / 1024.0


def measure(strategy: str, layer: str | None, length: int, repeats: int = 1, deepen_below: float | None = None) -> dict:
    """The passkey haystack compressed `repeats` times after a warm-up, in this process: median seconds,
    median peak memory beyond the engine (and the peaks' range), needle kept in every run."""
    import statistics

    import torch

    from ilre.compressor.strategies import requested_strategy
    from ilre.contract.messages import CompressRequest
    from ilre.engine.engine import Engine, EngineConfig
    from ilre.evaluation.tasks.passkey import make_passkey_sample

    # nothing kept between the warm-up and the measurement; the dtype as the servers read it (--dtype sets it)
    engine = Engine(EngineConfig(doc_cache_mb=0, dtype=os.environ.get("ILRE_DTYPE", "auto")))
    sample = make_passkey_sample(engine.tokenizer, length, 0.5, seed=7)

    def request(ids: list[int]) -> CompressRequest:
        options = {} if deepen_below is None else {"deepen_below": deepen_below}
        if strategy.startswith("cascade"):  # `ilre serve` and `ilre batch` run a first question from its stream
            options["first_from_stream"] = strategy == "cascade"
        return CompressRequest(context_ids=ids, query_ids=sample.query_ids, budget=1024, strategy="cascade"
                               if strategy.startswith("cascade") else strategy, layer=layer, strategy_options=options)

    engine.compress(request(sample.context_ids))  # loads the layers it runs; the allocator reaches its steady state
    seconds, peaks, kept_all, loaded = [], [], True, 0.0
    for _ in range(repeats):
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # VmHWM := VmRSS
        loaded = _status_mib("VmRSS")
        start = time.perf_counter()
        result = engine.compress(request(sample.context_ids))
        seconds.append(time.perf_counter() - start)
        peaks.append(_status_mib("VmHWM") - loaded)
        kept = set(result.kept_indices)
        kept_all = kept_all and all(i in kept for i in range(*sample.needle))
    median = statistics.median(seconds)
    # profiled on the engine's compute thread, where its kernels run (the profiler records the thread it starts on)
    tensors = (engine.thread.call(tensor_peak_mib, lambda: engine.compress(request(sample.context_ids)))
               if repeats > 1 else None)
    return {"strategy": strategy, "layer": result.layer, "options": repr(engine.with_profile(requested_strategy(request([0])))),
            "tokens": length, "repeats": repeats, "seconds": round(median, 3), "tokens_per_s": round(length / median),
            "beyond_engine_mib": round(statistics.median(peaks), 1), "beyond_engine_range_mib": [round(min(peaks), 1), round(max(peaks), 1)],
            "tensor_peak_mib": None if tensors is None else round(tensors, 1), "engine_mib": round(loaded), "needle_kept": kept_all, "placement": engine.placement.describe(),
            "threads": torch.get_num_threads(), "missed": deepen_below == 1.0}


def tensor_peak_mib(run: Callable[[], object]) -> float:
    """The most bytes of tensors allocated by `run()` and alive at once, in MiB (torch's profiler
    records every CPU allocation and free; their running sum peaks here)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    live = peak = 0
    for _, nbytes in sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                            if e.name() == "[memory]"):
        live += nbytes
        peak = max(peak, live)
    return peak / 2 ** 20


def child(strategy: str, layer: str | None, length: int, repeats: int = 1, deepen_below: float | None = None) -> dict:
    spec = f"{strategy}:{layer or ''}:{length}:{repeats}:{'' if deepen_below is None else deepen_below}"
    cmd = [sys.executable, __file__, "--child", spec]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return {"strategy": strategy, "layer": layer, "tokens": length, "error": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def label(row: dict) -> str:
    return {"cascade": "default (cascade)", "cascade_layer1": "default, from layer 1"}.get(
        row["strategy"], f"plain ILRe at layer {row['layer']}")


def r_squared(xs: list[float], ys: list[float]) -> float:
    """R^2 of the least-squares line y = a + b x."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    return sxy * sxy / (sxx * syy) if sxx and syy else 1.0


def _peak(row: dict) -> str:
    low, high = row.get("beyond_engine_range_mib", [row["beyond_engine_mib"]] * 2)
    return f"{row['beyond_engine_mib']:.0f} [{low:.0f}-{high:.0f}]"


def _tensors(row: dict) -> str:
    return "-" if row.get("tensor_peak_mib") is None else f"{row['tensor_peak_mib']:.1f}"


def _memory(row: dict) -> float:
    """What the memory target is judged on: the tensor peak where measured, else the RSS median."""
    return row["tensor_peak_mib"] if row.get("tensor_peak_mib") is not None else row["beyond_engine_mib"]


def report(rows: list[dict], linear: list[dict], missed: list[dict] = ()) -> list[str]:
    ok = [r for r in rows if "error" not in r]
    lines = [f"budget 1024, S=4 W=512 chunk=1024, {ok[0]['placement'] if ok else '?'}, {ok[0]['threads'] if ok else '?'} threads; "
             "Shakespeare with a passkey at 50% depth; RSS = peak RSS beyond the loaded engine, "
             f"median of {ok[0]['repeats'] if ok else '?'} runs (range in brackets); tensors = peak live tensor bytes",
             f"| {'what':<26} | {'context':>8} | {'seconds':>8} | {'tokens/s':>8} | {'RSS MiB':>13} | {'tensors MiB':>11} | {'x layer 8':>9} | {'needle':>6} |",
             f"|{'-' * 28}|{'-' * 10}|{'-' * 10}|{'-' * 10}|{'-' * 15}|{'-' * 13}|{'-' * 11}|{'-' * 8}|"]
    base = {r["tokens"]: r for r in ok if r["strategy"] == "ilre" and r["layer"] == min(x["layer"] for x in ok)}
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['strategy']} {r['layer']} | {r['tokens']:>8} | error: {r['error']}")
            continue
        ratio = r["seconds"] / base[r["tokens"]]["seconds"] if r["tokens"] in base else float("nan")
        lines.append(f"| {label(r):<26} | {r['tokens']:>8} | {r['seconds']:>8.2f} | {r['tokens_per_s']:>8} | "
                     f"{_peak(r):>13} | {_tensors(r):>11} | {ratio:>8.2f}x | {'kept' if r['needle_kept'] else 'lost':>6} |")
    default = {r["tokens"]: r for r in ok if r["strategy"] == "cascade"}
    deep = {r["tokens"]: r for r in ok if r["strategy"] == "ilre" and r["layer"] == max(x["layer"] for x in ok)}
    layer1 = {r["tokens"]: r for r in ok if r["strategy"] == "cascade_layer1"}
    for n in sorted(default):
        if n in base and n in deep:
            cost = default[n]["seconds"] / base[n]["seconds"]
            memory = _memory(default[n]) / _memory(deep[n])
            line = (f"{n} tokens: default {cost:.2f}x the time of layer {base[n]['layer']} (target <= {TARGET_COST}x: "
                    f"{'met' if cost <= TARGET_COST else 'NOT met'}), {deep[n]['seconds'] / default[n]['seconds']:.2f}x "
                    f"faster than layer {deep[n]['layer']}; peak tensor memory {memory:.2f}x layer {deep[n]['layer']}'s")
            if n in layer1:  # the memory target is the request's own: the served default's stream is held for deepening
                cost1, memory1 = layer1[n]["seconds"] / base[n]["seconds"], _memory(layer1[n]) / _memory(deep[n])
                line += (f" (its coarse stream, which the servers hold for deepening); from layer 1 (--deepen off) "
                         f"{cost1:.2f}x the time and {memory1:.2f}x the memory")
                memory = memory1
            lines.append(line + f" (memory target <= {TARGET_MEMORY}: {'met' if memory <= TARGET_MEMORY else 'NOT met'})")
    if 131072 in default:
        s = default[131072]["seconds"]
        lines.append(f"131072 tokens in {s:.1f} s (target < {TARGET_128K_S:.0f} s, stretch < 30 s): "
                     f"{'met' if s < TARGET_128K_S else 'NOT met'}{', stretch met' if s < 30 else ''}")
    done = [r for r in linear if "error" not in r]
    if len(done) >= 3:
        r2 = r_squared([r["tokens"] for r in done], [r["seconds"] for r in done])
        lines.append("default alone: " + ", ".join(f"{r['tokens']} {r['seconds']:.1f} s ({'kept' if r['needle_kept'] else 'lost'})"
                                                   for r in done)
                     + f"; seconds linear in length: R^2 = {r2:.5f} (target >= 0.99: {'met' if r2 >= 0.99 else 'NOT met'})")
    for r in (r for r in missed if "error" not in r):
        n = r["tokens"]
        against = [f"{r['seconds'] / d[n]['seconds']:.2f}x {what}" for d, what in ((default, "the default"),
                   (base, "plain ILRe at layer 8"), (deep, "plain ILRe at l_R")) if n in d]
        lines.append(f"{n} tokens, the default when its candidates miss (the whole context then read to l_R): "
                     f"{r['seconds']:.1f} s, " + ", ".join(against))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="32768,131072")
    parser.add_argument("--repeats", type=int, default=3, help="measured runs per comparison row (median reported)")
    parser.add_argument("--linear", default="8192,32768,131072,524288,1048576", help="lengths of the default alone ('' = none)")
    parser.add_argument("--missed", default="32768", help="lengths of the default with its fallback taken ('' = none)")
    parser.add_argument("--output", default="results/bench/default.jsonl")
    parser.add_argument("--dtype", default=None, help="the engine's dtype (default: $ILRE_DTYPE, else auto)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dtype:
        os.environ["ILRE_DTYPE"] = args.dtype  # the children's
    if args.child:
        strategy, layer, length, repeats, deepen = args.child.split(":")
        print(json.dumps(measure(strategy, layer or None, int(length), int(repeats), float(deepen) if deepen else None)))
        return
    rows, linear = [], []
    for length in [int(x) for x in args.lengths.split(",") if x]:
        for strategy, layer in KINDS:
            rows.append(child(strategy, layer, length, args.repeats))
            print(f"  measured {strategy} {layer or ''} at {length} tokens", file=sys.stderr, flush=True)
    measured = {r["tokens"]: r for r in rows if r["strategy"] == "cascade" and "error" not in r}
    for length in [int(x) for x in args.linear.split(",") if x]:
        linear.append(measured.get(length) or child("cascade", None, length))
        print(f"  measured the default at {length} tokens", file=sys.stderr, flush=True)
    missed = [child("cascade", None, int(length), 1, deepen_below=1.0) for length in args.missed.split(",") if length]
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("".join(json.dumps(r) + "\n" for r in rows + [r for r in linear if r not in rows] + missed))
    print("\n".join(report(rows, linear, missed)))


if __name__ == "__main__":
    main()
