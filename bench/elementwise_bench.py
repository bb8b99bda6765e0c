"""The passes around the matmuls, side by side with what they replaced, in one run:

- per operator: int8's per-token quantization, RoPE, SiLU-and-product and the residual add, each timed as written
  now and as the textbook formula it replaces (the two are equal bit for bit: tests/kernels/test_rope.py,
  tests/models/test_int8.py), best of 3 x 30 calls on one chunk's shapes;
- per request: a first question of --tokens (the default, `--dtype auto`) with the servers' allocator tuning
  (engine/heap.py) at its mmap threshold now (32 MiB) and at 4 MiB, the two alternating --repeats times in one
  process: wall time and the minor page faults each took.

    .venv/bin/python bench/elementwise_bench.py [--tokens 32768] [--repeats 3]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch
import torch.nn.functional as F

from ilre.engine import heap
from ilre.kernels.rope import apply_rope, rotate_half
from ilre.models.int8 import ACTIVATION_LEVELS, quantize_tokens


def textbook_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = x.abs().amax(-1, keepdim=True).div_(ACTIVATION_LEVELS).clamp_min_(1e-12)
    return scale, torch.div(x, scale).round_().add_(128).to(torch.uint8)


def best_ms(fn, calls: int = 30, rounds: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        for _ in range(calls):
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
    return best * 1e3


def operators() -> None:
    chunk = 1024
    x_mlp, x_model = torch.randn(chunk, 1536), torch.randn(chunk, 576)
    q, cos, sin = torch.randn(12, chunk, 64), torch.randn(chunk, 64), torch.randn(chunk, 64)
    gate_up = torch.randn(chunk, 3072)

    def silu_then(inplace: bool):
        gate, up = gate_up.clone().chunk(2, dim=-1)  # a fresh product, as the layer's matmul returns it
        return torch.mul(F.silu(gate, inplace=True), up) if inplace else F.silu(gate) * up

    rows = [("int8 quantization, 1024 x 1536", lambda: textbook_quantize(x_mlp), lambda: quantize_tokens(x_mlp)),
            ("int8 quantization, 1024 x 576", lambda: textbook_quantize(x_model), lambda: quantize_tokens(x_model)),
            ("RoPE, 12 x 1024 x 64", lambda: q * cos + rotate_half(q) * sin, lambda: apply_rope(q, cos, sin)),
            ("SiLU(gate) * up, 1024 x 1536 (with the clone)", lambda: silu_then(False), lambda: silu_then(True)),
            ("residual add, 1024 x 576 (with the clone)", lambda: x_model + x_model.clone(),
             lambda: x_model.clone().add_(x_model))]
    print(f"| operator ({torch.get_num_threads()} threads) | textbook ms | now ms | speed-up |")
    print("|---|---|---|---|")
    for name, before, now in rows:
        a, b = best_ms(before), best_ms(now)
        print(f"| {name} | {a:.2f} | {b:.2f} | {a / b:.2f}x |")


def allocator(tokens: int, repeats: int) -> None:
    from ilre.engine.engine import Engine, EngineConfig
    from ilre.contract.messages import CompressRequest
    from ilre.evaluation.tasks.passkey import make_passkey_sample

    if not heap.tune_allocator():
        print("\nallocator: not tuned here (no mallopt, or MALLOC_*/GLIBC_TUNABLES set): skipped")
        return
    libc = heap._libc()  # its mallopt typed by tune_allocator
    engine = Engine(EngineConfig(doc_cache_mb=0))
    sample = make_passkey_sample(engine.tokenizer, tokens, 0.5, seed=7)
    ask = lambda ids: CompressRequest(context_ids=ids, query_ids=sample.query_ids, budget=1024)  # noqa: E731
    engine.compress(ask(sample.context_ids[:4096]))  # warm-up: packing, first-call allocations
    runs: dict[int, list[tuple[float, int]]] = {heap.MMAP_THRESHOLD: [], 4 << 20: []}
    for _ in range(repeats):
        for threshold, seen in runs.items():
            libc.mallopt(heap.M_MMAP_THRESHOLD, threshold)
            libc.malloc_trim(0)
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            engine.compress(ask(sample.context_ids))
            seen.append((time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults))
    print(f"\n{tokens} tokens, the default, {engine.placement.describe()}, {repeats} runs of each, alternating:")
    engine.close()
    print("| mmap threshold | seconds (median) | runs | minor faults (median) |")
    print("|---|---|---|---|")
    for threshold, seen in runs.items():
        label = f"{threshold >> 20} MiB" + (" (now)" if threshold == heap.MMAP_THRESHOLD else "")
        print(f"| {label} | {statistics.median(s for s, _ in seen):.2f} | "
              f"{', '.join(f'{s:.2f}' for s, _ in seen)} | {statistics.median(f for _, f in seen):,.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    operators()
    allocator(args.tokens, args.repeats)


if __name__ == "__main__":
    main()
