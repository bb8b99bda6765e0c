"""`make bench` (speed): compression per dtype and context length against the machine's roofline.

For each dtype (float32, bfloat16, int8: the linear layers in int8, the rest float32) the same run measures the
matmul peak of this machine, then
compresses a passkey document (needle at 50% depth, budget 1024) with plain ILRe at the profile's
`fast` layer (the streaming prefill the default cascade runs over the whole context; the default
itself: default_bench.py) at every length, each in its own
process: seconds, tokens/s, peak RSS beyond the loaded model and the input (VmHWM reset just
before the call), the prefill's useful FLOPs over the seconds (GFLOP/s and % of the peak), a
linear fit of seconds over length (R^2), whether the needle was kept, and the overlap of the
kept indices with float32's. Then 32 short requests (~300 tokens, budget 64) compressed one by
one vs as one batch (Engine.compress_many), with their results compared.
Rows are appended to --results (JSONL) as they finish; a rerun skips rows already there (--fresh
starts over), so a cut-short run resumes.
Usage: bench/speed_bench.py [--lengths 8192,32768,131072,524288,1048576] [--dtypes float32,bfloat16,int8]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

BUDGET = 1024


def layer_flops_per_token(spec) -> float:
    """FLOPs of one full decoder layer's projections and MLP for one token."""
    d, hd, heads, kv, ff = spec.hidden_size, spec.head_dim, spec.num_heads, spec.num_kv_heads, spec.intermediate_size
    return 2 * (d * (heads + 2 * kv) * hd + heads * hd * d + 3 * d * ff)


def prefill_flops(spec, l_r: int, length: int, n_query: int, config) -> float:
    """Useful FLOPs of the streaming prefill + scoring: projections and MLP of layers < l_R, the
    keys (context) and queries (query) of l_R, attention over each chunk's visible keys."""
    from ilre.compressor.context_state import chunk_bounds

    d, hd, heads, kv = spec.hidden_size, spec.head_dim, spec.num_heads, spec.num_kv_heads
    per_token = layer_flops_per_token(spec)
    dense = (length + n_query) * (l_r - 1) * per_token + 2 * d * hd * (kv * length + heads * n_query)
    pairs, seen = 0, 0  # (query, key) pairs attended, summed over chunks
    window = config.window or length
    for start, end in chunk_bounds(length, config) + [(length, length + n_query)]:
        n = end - start
        prefix = 0 if start == 0 else min(config.sink, length) + min(window, max(0, seen - config.sink))
        pairs += n * prefix + n * (n + 1) // 2
        seen = min(end, length)
    attention = 4 * heads * hd * pairs * (l_r - 1)
    scoring = 2 * 2 * heads * n_query * hd * length  # two passes of q.k over the key cache
    return float(dense + attention + scoring)


def machine_id() -> str:
    """CPU model, thread count and whether it multiplies bfloat16 natively: rows measured on another machine
    are not resumed (one CPU model name covers both kinds)."""
    import os

    from ilre.models.device import cpu_has_native_bfloat16

    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.machine())
    native = "" if cpu_has_native_bfloat16() else ", no native bfloat16"
    return f"{model}, {os.cpu_count()} cpus{native}"


def _reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def _rss_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"{field} missing from /proc/self/status")


def measure_peak(dtype: str) -> dict:
    """Best of a few 4096x4096 matmuls in `dtype` on this machine's threads: GFLOP/s (int8: oneDNN's int8
    linear as models/int8.py runs it, activations quantized per token included)."""
    import torch

    if dtype == "int8":
        from ilre.models.int8 import Int8Linear

        linear, x = Int8Linear(torch.randn(4096, 4096)), torch.randn(4096, 4096)
        multiply = lambda: linear(x)  # noqa: E731
    else:
        a, b = (torch.randn(4096, 4096).to(getattr(torch, dtype)) for _ in range(2))
        multiply = lambda: a @ b  # noqa: E731
    multiply()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        multiply()
        best = min(best, time.perf_counter() - start)
    return {"kind": "peak", "dtype": dtype, "gflops": 2 * 4096**3 / best / 1e9, "threads": torch.get_num_threads()}


def measure_compress(dtype: str, length: int, device: str) -> dict:
    import gc

    import torch

    from ilre.engine.engine import Engine, EngineConfig
    from ilre.contract.messages import CompressRequest
    from ilre.evaluation.tasks.passkey import make_passkey_sample

    engine = Engine(EngineConfig(dtype=dtype, device=device))
    sample = make_passkey_sample(engine.tokenizer, length, 0.5, seed=7)
    plain = {"strategy": "ilre", "layer": "fast"}  # the streaming prefill the FLOP count describes (the cascade's first pass)
    engine.compress(CompressRequest(context_ids=sample.context_ids[:4096], query_ids=sample.query_ids, budget=BUDGET, **plain))
    request = CompressRequest(context_ids=sample.context_ids, query_ids=sample.query_ids, budget=BUDGET, **plain)
    gc.collect()
    before = _rss_mib("VmRSS")
    _reset_peak_rss()
    start = time.perf_counter()
    result = engine.compress(request)
    seconds = time.perf_counter() - start
    peak = _rss_mib("VmHWM")
    kept = set(result.kept_indices)
    flops = prefill_flops(engine.spec, result.layer, length, len(sample.query_ids), engine.config.prefill)
    return {"kind": "compress", "dtype": dtype, "tokens": length, "seconds": seconds, "tokens_per_s": length / seconds,
            "rss_beyond_mib": peak - before, "gflops": flops / seconds / 1e9, "layer": result.layer, "dca": result.dca,
            "needle_kept": all(i in kept for i in range(*sample.needle)), "kept": result.kept_indices,
            "stages_ms": {k: v for k, v in result.timings_ms.items() if k in ("prefill", "score", "allocate")},
            "placement": engine.placement.describe(), "threads": torch.get_num_threads()}


def measure_batch(dtype: str, device: str, n_requests: int = 32, tokens: int = 300) -> dict:
    from ilre.engine.engine import Engine, EngineConfig
    from ilre.contract.messages import CompressRequest
    from ilre.evaluation.tasks.passkey import make_passkey_sample

    engine = Engine(EngineConfig(dtype=dtype, device=device, batch_tokens=16384))  # batching on, whatever the device
    samples = [make_passkey_sample(engine.tokenizer, tokens + (i % 5) * 10, (i % 10) / 10, seed=i) for i in range(n_requests)]
    requests = [CompressRequest(context_ids=s.context_ids, query_ids=s.query_ids, budget=64, strategy="ilre")  # batchable
                for s in samples]
    engine.compress_many(requests[:4])
    engine.compress(requests[0])  # both paths warmed up
    start = time.perf_counter()
    one_by_one = [engine.compress(r) for r in requests]
    sequential = time.perf_counter() - start
    start = time.perf_counter()
    together = engine.compress_many(requests)
    batched = time.perf_counter() - start
    equal = sum(a.kept_indices == b.results[0].kept_indices for a, b in zip(one_by_one, together))
    return {"kind": "batch", "dtype": dtype, "requests": n_requests, "tokens": sum(len(r.context_ids) for r in requests),
            "sequential_s": sequential, "batched_s": batched, "speedup": sequential / batched, "equal": equal}


def child(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1], "args": args}
    return json.loads(out.stdout.strip().splitlines()[-1])


def r_squared(xs: list[float], ys: list[float]) -> float:
    """R^2 of the least-squares line y = a + b x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx
    ss_res = sum((y - (my + slope * (x - mx))) ** 2 for x, y in zip(xs, ys))
    ss_tot = sum((y - my) ** 2 for y in ys)
    return 1.0 - ss_res / ss_tot if ss_tot else 1.0


def report(rows: list[dict], dtypes: list[str], lengths: list[int]) -> str:
    peaks = {r["dtype"]: r["gflops"] for r in rows if r["kind"] == "peak"}
    found = {(r["dtype"], r["tokens"]): r for r in rows if r["kind"] == "compress"}
    f32 = {t: set(r["kept"]) for (dt, t), r in found.items() if dt == "float32"}
    lines = [f"machine: {next((r['machine'] for r in rows if 'machine' in r), '?')}, "
             f"{next((r['threads'] for r in rows if 'threads' in r), '?')} torch threads; "
             f"matmul peak (4096^2): " + ", ".join(f"{dt} {peaks[dt]:.0f} GFLOP/s" for dt in dtypes if dt in peaks),
             f"budget {BUDGET}, S=4 W=512 chunk=1024, needle = passkey at 50% depth kept whole",
             "", "| dtype | context | seconds | tokens/s | peak RSS beyond model MiB | GFLOP/s | % of bf16 peak | % of own peak | needle | kept = float32's |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for dt in dtypes:
        for t in lengths:
            r = found.get((dt, t))
            if r is None:
                continue
            overlap = len(set(r["kept"]) & f32[t]) / len(f32[t]) if t in f32 else None
            lines.append(f"| {dt} | {t} | {r['seconds']:.2f} | {r['tokens_per_s']:.0f} | {r['rss_beyond_mib']:.0f} | "
                         f"{r['gflops']:.0f} | {100 * r['gflops'] / peaks.get('bfloat16', float('nan')):.0f}% | "
                         f"{100 * r['gflops'] / peaks.get(dt, float('nan')):.0f}% | {'kept' if r['needle_kept'] else 'lost'} | "
                         f"{'-' if overlap is None else f'{100 * overlap:.1f}%'} |")
    lines.append("")
    for dt in dtypes:
        pts = sorted((t, found[(dt, t)]["seconds"]) for t in lengths if (dt, t) in found)
        if len(pts) >= 3:
            lines.append(f"{dt}: seconds linear in length, R^2 = {r_squared([p[0] for p in pts], [p[1] for p in pts]):.5f} "
                         f"over {', '.join(str(p[0]) for p in pts)}")
    for dt in dtypes:
        shared = [t for t in lengths if (dt, t) in found and t in f32]
        if dt == "float32" or not shared:
            continue
        mean = sum(len(set(found[(dt, t)]["kept"]) & f32[t]) / len(f32[t]) for t in shared) / len(shared)
        speed = ", ".join(f"{t}: {found[('float32', t)]['seconds'] / found[(dt, t)]['seconds']:.2f}x" for t in shared)
        lines.append(f"{dt} keeps {100 * mean:.1f}% of float32's kept indices on average over {len(shared)} lengths; "
                     f"its speed over float32's: {speed}")
    for r in rows:
        if r["kind"] == "batch":
            lines.append(f"{r['dtype']}: {r['requests']} requests ({r['tokens']} tokens): one by one {r['sequential_s']:.2f} s "
                         f"({r['requests'] / r['sequential_s']:.1f} req/s), batched {r['batched_s']:.2f} s "
                         f"({r['requests'] / r['batched_s']:.1f} req/s): {r['speedup']:.2f}x; results equal: {r['equal']}/{r['requests']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="8192,32768,131072,524288,1048576")
    parser.add_argument("--dtypes", default="float32,bfloat16,int8")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--results", default="results/bench/speed.jsonl", help="JSONL of measured rows (resumed)")
    parser.add_argument("--fresh", action="store_true", help="discard earlier rows")
    parser.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        kind, dtype, *rest = args.child
        row = (measure_peak(dtype) if kind == "peak" else measure_batch(dtype, args.device) if kind == "batch"
               else measure_compress(dtype, int(rest[0]), args.device))
        print(json.dumps(row))
        return
    lengths = [int(x) for x in args.lengths.split(",") if x]
    dtypes = [x for x in args.dtypes.split(",") if x]
    path = Path(args.results)
    path.parent.mkdir(parents=True, exist_ok=True)
    if args.fresh and path.exists():
        path.unlink()
    machine = machine_id()
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    rows = [r for r in rows if r.get("machine") == machine]
    done = {(r["kind"], r["dtype"], r.get("tokens") if r["kind"] == "compress" else None) for r in rows}
    plan = [("peak", dt, None) for dt in dtypes] + [("compress", dt, t) for dt in dtypes for t in lengths]
    plan += [("batch", dt, None) for dt in dtypes]
    for kind, dtype, tokens in plan:
        if (kind, dtype, tokens) in done:
            continue
        row = child([kind, dtype] + ([str(tokens)] if tokens else []) + ["--device", args.device])
        if "error" in row:
            print(f"  {kind} {dtype} {tokens or ''}: error: {row['error']}", file=sys.stderr, flush=True)
            continue
        row["machine"] = machine
        rows.append(row)
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"  measured {kind} {dtype} {tokens or ''}", file=sys.stderr, flush=True)
    print(report(rows, dtypes, lengths))


if __name__ == "__main__":
    main()
