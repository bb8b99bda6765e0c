"""`make bench`: compress latency and peak RSS per context length on the embedded model.

Each measurement runs in its own process so peak RSS belongs to that measurement alone. ilre runs
with the default --device/--dtype auto; the dense baseline is the full transformers model (all
layers, SDPA attention, float32) prefilling the same context. Per-dtype numbers: speed_bench.py.
Usage: bench/compress_bench.py [--lengths 8192,32768,131072] [--dense 8192] [--strategy cascade]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure_compress(length: int, strategy: str, layer: int | None) -> dict:
    import torch

    from ilre.engine.engine import Engine, EngineConfig
    from ilre.contract.messages import CompressRequest
    from ilre.evaluation.tasks.passkey import make_passkey_sample

    loading = time.perf_counter()
    engine = Engine(EngineConfig(layer=layer))
    load_seconds = time.perf_counter() - loading
    sample = make_passkey_sample(engine.tokenizer, length, 0.5, seed=7)
    warm = CompressRequest(context_ids=sample.context_ids[:2048], query_ids=sample.query_ids, budget=1024, strategy=strategy)
    engine.compress(warm)  # first-call initialisation out of the timing
    base_rss = peak_rss_mib()
    request = CompressRequest(context_ids=sample.context_ids, query_ids=sample.query_ids, budget=1024, strategy=strategy)
    start = time.perf_counter()
    result = engine.compress(request)
    wall = time.perf_counter() - start
    kept = set(result.kept_indices)
    return {"kind": f"{strategy} l_R={result.layer}", "tokens": length, "seconds": wall,
            "tokens_per_s": length / wall, "peak_rss_mib": peak_rss_mib(), "rss_before_mib": base_rss,
            "allocate_share": result.timings_ms.get("allocate", 0.0) / result.timings_ms["total"],
            "dca": result.dca, "needle_kept": all(i in kept for i in range(*sample.needle)),
            "threads": torch.get_num_threads(), "load_seconds": load_seconds, "placement": engine.placement.describe()}


def measure_dense(length: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from ilre.evaluation.tasks.passkey import make_passkey_sample
    from ilre.models.loader import load_tokenizer, resolve_checkpoint

    checkpoint = resolve_checkpoint(None)
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint.path), dtype=torch.float32, attn_implementation="sdpa").eval()
    sample = make_passkey_sample(load_tokenizer(checkpoint.path), length, 0.5, seed=7)
    ids = torch.tensor([sample.context_ids + sample.query_ids])
    with torch.inference_mode():
        model(ids[:, :1024], use_cache=False, logits_to_keep=1)  # warm-up
        base_rss = peak_rss_mib()
        start = time.perf_counter()
        model(ids, use_cache=False, logits_to_keep=1)
        wall = time.perf_counter() - start
    return {"kind": f"dense prefill, all {model.config.num_hidden_layers} layers", "tokens": length,
            "seconds": wall, "tokens_per_s": length / wall, "peak_rss_mib": peak_rss_mib(),
            "rss_before_mib": base_rss, "allocate_share": None, "dca": False, "needle_kept": None,
            "threads": torch.get_num_threads()}


def child(kind: str, length: int, strategy: str, layer: int | None) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--lengths", str(length), "--strategy", strategy]
    if layer:
        cmd += ["--layer", str(layer)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return {"kind": kind, "tokens": length, "error": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    head = f"| {'what':<34} | {'context':>8} | {'seconds':>8} | {'tokens/s':>9} | {'peak RSS MiB':>12} | {'RSS before':>10} | {'alloc %':>7} | {'DCA':>3} | {'needle':>6} |"
    lines = [head, "|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['kind']:<34} | {r['tokens']:>8} | error: {r['error']}")
            continue
        share = "-" if r["allocate_share"] is None else f"{100 * r['allocate_share']:.2f}"
        needle = "-" if r["needle_kept"] is None else ("kept" if r["needle_kept"] else "lost")
        lines.append(f"| {r['kind']:<34} | {r['tokens']:>8} | {r['seconds']:>8.2f} | {r['tokens_per_s']:>9.0f} | "
                     f"{r['peak_rss_mib']:>12.0f} | {r['rss_before_mib']:>10.0f} | {share:>7} | {'on' if r['dca'] else 'off':>3} | {needle:>6} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="8192,32768,131072")
    parser.add_argument("--dense", default="8192", help="lengths for the dense full-model baseline ('' = none)")
    parser.add_argument("--strategy", default="cascade")
    parser.add_argument("--layer", type=int, default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",") if x]
    if args.child:
        row = measure_dense(lengths[0]) if args.child == "dense" else measure_compress(lengths[0], args.strategy, args.layer)
        print(json.dumps(row))
        return
    rows = []
    for length in lengths:
        rows.append(child("compress", length, args.strategy, args.layer))
        print(f"  measured {args.strategy} at {length} tokens", file=sys.stderr, flush=True)
    for length in [int(x) for x in args.dense.split(",") if x]:
        rows.append(child("dense", length, args.strategy, args.layer))
        print(f"  measured dense prefill at {length} tokens", file=sys.stderr, flush=True)
    threads = next((r["threads"] for r in rows if "threads" in r), "?")
    placement = next((r["placement"] for r in rows if "placement" in r), "?")
    print(f"budget 1024, S=4 W=512 chunk=1024, ilre on {placement} (--dtype auto), dense baseline float32, "
          f"{threads} threads; needle = passkey at 50% depth kept whole")
    print(table(rows))
    loads = [r["load_seconds"] for r in rows if "load_seconds" in r]
    if loads:
        print(f"engine start (cached checkpoint, tokenizer + truncated model): {min(loads):.2f}-{max(loads):.2f} s")


if __name__ == "__main__":
    main()
