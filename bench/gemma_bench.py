"""Gemma 3 270M's first question beside SmolLM2's, in the same run: a passkey at half depth in --lengths tokens,
budget 1024, the default strategy at each model's default l_R, `--dtype auto`, each model in its own process after a
warm-up on 2K tokens (the load's seconds and the resident memory after it): seconds, the peak resident memory the
request added over the loaded engine, whether the passkey was kept, and the share of the matmul peak of the dtype it ran in: the useful FLOPs of what the first
question computes (bench/speed_bench.prefill_flops: the streaming prefill to the layer whose attention reads the whole
context, the coarse layer for the cascade, plus the cascade's candidates run on to l_R) over its seconds, against
the best 4096 x 4096 matmul in that dtype measured in the same process (speed_bench.measure_peak).
Where a model has sliding-window layers below l_R (Gemma: 5 of its first 6), the seconds its first question spends in
their attention, and one chunk of such a layer at the model's own shapes (its heads, head width, window, the
profile's chunk) two ways in the same process: banded (kernels/masked_attention.sliding_attention, what runs) and as
one block against every key of the chunk and the ring under the written-out mask (what ran before it). And the
linear layers of one decoder layer on a chunk (q, k, v, o, gate, up, down at the model's widths), by each kernel
the hand-tuned Llama path has: F.linear in float32 and in bfloat16 (what the family path runs), oneDNN's packed
bfloat16 (models/packed_linear.py) and int8 (models/int8.Int8Linear, rounded to nearest), where this CPU runs them.

    .venv/bin/python bench/gemma_bench.py [--lengths 32768,131072]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from speed_bench import layer_flops_per_token, measure_peak, prefill_flops  # noqa: E402

MODELS = ("embedded", "gemma-3-270m")


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith(field + ":")).split()[1]) / 1024.0


def one_model(model: str, lengths: list[int]) -> dict:
    """In this process: the engine on `model`, a first question per length (fresh contexts, no document cache)."""
    from ilre.compressor.strategies import requested_strategy
    from ilre.contract.messages import CompressRequest
    from ilre.engine.engine import Engine, EngineConfig
    from ilre.evaluation.tasks.passkey import make_passkey_sample

    start = time.perf_counter()
    engine = Engine(EngineConfig(model=model, doc_cache_mb=0))
    engine.model_at(engine.layer)
    load_s = time.perf_counter() - start
    warm = make_passkey_sample(engine.tokenizer, 2048, 0.5, seed=1)
    engine.compress(CompressRequest(context_ids=warm.context_ids, query_ids=warm.query_ids, budget=256))
    dtype = engine.placement.dtype_name
    peak = measure_peak(dtype)["gflops"]
    strategy = engine.with_profile(requested_strategy(CompressRequest(context="x", query="x")))
    coarse = getattr(strategy, "coarse_layer", None)
    out = {"model": engine.model_name, "layer": engine.layer, "dtype": dtype, "peak_gflops": peak,
           "strategy": repr(strategy), "rows": [], "load_s": load_s, "engine_mib": _status_mib("VmRSS")}
    sliding = _time_sliding_layers()
    out["band"] = _band_against_one_block(engine)
    out["linears"] = _linear_kernels(engine)
    for length in lengths:
        sample = make_passkey_sample(engine.tokenizer, length, 0.5, seed=7)
        sliding["seconds"] = 0.0
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        loaded = _status_mib("VmRSS")
        start = time.perf_counter()
        result = engine.compress(CompressRequest(context_ids=sample.context_ids, query_ids=sample.query_ids,
                                                 budget=1024))
        seconds = time.perf_counter() - start
        kept = set(result.kept_indices)
        flops = first_question_flops(engine, strategy, coarse, result.layer, sample, 1024)
        out["rows"].append({"tokens": len(sample.context_ids), "seconds": seconds,
                            "peak_mib": _status_mib("VmHWM") - loaded, "dca": result.dca,
                            "kept": all(i in kept for i in range(*sample.needle)),
                            "gflops": flops / seconds / 1e9, "peak_share": flops / seconds / 1e9 / peak,
                            "sliding_s": sliding["seconds"]})
    return out


def _time_sliding_layers() -> dict:
    """Wrap the sliding layers' attention (as the window cache calls it) with a timer; returns the running total."""
    import ilre.compressor.window_cache as window_cache

    spent = {"seconds": 0.0}
    inner = window_cache.sliding_attention

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent["seconds"] += time.perf_counter() - start

    window_cache.sliding_attention = timed
    return spent


def _best_ms(run, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return 1000 * min(times)


def _linear_kernels(engine) -> dict:
    """Milliseconds of one decoder layer's linear products on a chunk (best of 7), per kernel that runs here, with
    the GFLOP/s they reach; the widths are the model's."""
    import torch
    import torch.nn.functional as F

    from ilre.models.int8 import Int8Linear, int8_available
    from ilre.models.packed_linear import PackedLinear, packing_applies

    spec, rows = engine.spec, engine.config.prefill.chunk
    hidden, q_width = spec.hidden_size, spec.num_heads * spec.head_dim
    kv_width = spec.num_kv_heads * spec.head_dim
    shapes = ((q_width, hidden), (kv_width, hidden), (kv_width, hidden), (hidden, q_width),
              (spec.intermediate_size, hidden), (spec.intermediate_size, hidden), (hidden, spec.intermediate_size))
    weights = [torch.randn(n, k) / k ** 0.5 for n, k in shapes]
    flops = sum(2 * rows * n * k for n, k in shapes)
    x = {k: torch.randn(rows, k) for k in {k for _, k in shapes}}
    kernels = {"float32": lambda: [F.linear(x[w.shape[1]], w) for w in weights]}
    bf16_w = [w.bfloat16() for w in weights]
    bf16_x = {k: v.bfloat16() for k, v in x.items()}
    kernels["bfloat16"] = lambda: [F.linear(bf16_x[w.shape[1]], w) for w in bf16_w]
    if packing_applies(torch.bfloat16, torch.device("cpu")):
        packed = [PackedLinear(torch.nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=torch.bfloat16)) for w in bf16_w]
        kernels["packed bfloat16"] = lambda: [p(bf16_x[p.in_features]) for p in packed]
    if int8_available():
        quantized = [Int8Linear(w) for w in weights]
        kernels["int8"] = lambda: [q(x[q.in_features]) for q in quantized]
    out = {"rows": rows, "widths": f"{hidden} -> {q_width}/{kv_width}, {spec.intermediate_size}"}
    for name, run in kernels.items():
        run()
        ms = _best_ms(run)
        out[name] = {"ms": ms, "gflops": flops / ms / 1e6}
    return out


def _band_against_one_block(engine, repeats: int = 7) -> dict | None:
    """Milliseconds of one chunk of the model's first sliding layer, banded and as one block (best of `repeats`);
    None for a model without sliding layers."""
    import torch

    from ilre.kernels.masked_attention import masked_attention, sliding_attention
    from ilre.models.spec import SLIDING

    model = engine.model_at(engine.layer)
    rule = next((r for r in getattr(model, "rules", ()) if r.kind == SLIDING), None)
    if rule is None:
        return None
    chunk, window, seen = engine.config.prefill.chunk, rule.window, 100_000
    dtype = model.dtype
    q = torch.randn(engine.spec.num_heads, chunk, rule.head_dim, dtype=dtype)
    k = torch.randn(rule.kv_heads, window - 1 + chunk, rule.head_dim, dtype=dtype)
    v = torch.randn(rule.kv_heads, window - 1 + chunk, rule.v_dim, dtype=dtype)
    rows = torch.arange(seen, seen + chunk)
    at = torch.cat((torch.arange(seen - window + 1, seen), rows))
    visible = (at.unsqueeze(0) <= rows.unsqueeze(1)) & (at.unsqueeze(0) > rows.unsqueeze(1) - window)

    return {"chunk": chunk, "window": window, "heads": engine.spec.num_heads, "head_dim": rule.head_dim,
            "banded_ms": _best_ms(lambda: sliding_attention(q, k, v, at, rows, window, rule.sinks), repeats),
            "one_block_ms": _best_ms(lambda: masked_attention(q, k, v, visible, rule.sinks), repeats)}


def first_question_flops(engine, strategy, coarse: int | None, l_r: int, sample, budget: int) -> float:
    """Useful FLOPs of a first question: the streaming prefill to the layer that reads the whole context (l_R, or
    the cascade's coarse layer), and the cascade's candidates (candidate_count(budget) tokens) run on through the
    layers from the coarse layer to l_R."""
    spec, length, n_query = engine.spec, len(sample.context_ids), len(sample.query_ids)
    if coarse is None or coarse >= l_r:
        return prefill_flops(spec, l_r, length, n_query, engine.config.prefill)
    candidates = min(length, strategy.reading().candidate_count(budget))
    return (prefill_flops(spec, coarse, length, n_query, engine.config.prefill)
            + (l_r - coarse) * layer_flops_per_token(spec) * candidates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="32768,131072")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child process's model
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    if args.one:
        print(json.dumps(one_model(args.one, lengths)))
        return
    runs = []
    for model in MODELS:
        done = subprocess.run([sys.executable, __file__, "--one", model, "--lengths", args.lengths],
                              capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{model} failed:\n{done.stderr[-3000:]}")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print("\nA first question (passkey at half depth, budget 1024, the default strategy), each model in its own process")
    print("| model | l_R | dtype | context tokens | seconds | MiB over the loaded engine | DCA | passkey | GFLOP/s | "
          "share of the matmul peak |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for run in runs:
        for row in run["rows"]:
            print(f"| {run['model']} | {run['layer']} | {run['dtype']} | {row['tokens']} | {row['seconds']:.2f} | "
                  f"{row['peak_mib']:.0f} | {row['dca']} | {'kept' if row['kept'] else 'lost'} | {row['gflops']:.0f} | "
                  f"{100 * row['peak_share']:.0f}% of {run['peak_gflops']:.0f} |")
    for run in runs:
        print(f"{run['model']}: {run['strategy']}; engine and model to l_R loaded in {run['load_s']:.1f} s, "
              f"{run['engine_mib']:.0f} MiB resident after a 2K warm-up")
        for row in run["rows"]:
            if row["sliding_s"]:
                print(f"  {row['tokens']} tokens: {row['sliding_s']:.2f} s of {row['seconds']:.2f} in the sliding layers' "
                      f"attention")
        band = run.get("band")
        if band:
            print(f"  one sliding-layer chunk ({band['heads']} heads x {band['chunk']} rows, head width "
                  f"{band['head_dim']}, window {band['window']}, {run['dtype']}): banded {band['banded_ms']:.1f} ms, "
                  f"one block under the written-out mask {band['one_block_ms']:.1f} ms")
        linears = run["linears"]
        print(f"  one layer's linear products on a {linears['rows']}-row chunk (widths {linears['widths']}): " + ", ".join(
            f"{name} {v['ms']:.1f} ms ({v['gflops']:.0f} GFLOP/s)" for name, v in linears.items() if isinstance(v, dict)))


if __name__ == "__main__":
    main()
