"""The C layer passes (kernels/layer_passes.py) against PyTorch's operators, in one process, alternating.

1. Each pass at a prefill chunk's shape (1024 tokens of the embedded model: D 576, F 1536, 9 + 2 x 3 heads of 64), best
   of 50 calls, the chain of PyTorch operators it replaces beside it.
2. End to end, on fresh contexts (no document cache): a first question over --tokens (passkey, budget 1024) by the
   default and by plain ILRe at l_R, and --lines short lines (~700 tokens of Python's reference text, ratio 0.3, as
   bench/short_lines_bench.py sends them), the two paths alternating (ILRE_NATIVE_PASSES, read at each call):
   median seconds, and the share of kept tokens both paths keep.

    .venv/bin/python bench/layer_passes_bench.py [--tokens 32768] [--repeats 3] [--lines 24] [--dtype auto]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stage_limits import best_s  # noqa: E402

MODES = {"c": "1", "torch": "0"}


def micro(dtype_name: str) -> None:
    """Each pass and the operators it replaces, ms per call at a chunk's shape."""
    import torch
    import torch.nn.functional as F

    from ilre.kernels import layer_passes
    from ilre.kernels.rope import apply_rope

    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(0)
    tokens, dim, ffn = 1024, 576, 1536
    h = torch.randn(tokens, dim, generator=gen)
    out = torch.randn(tokens, dim, generator=gen).to(dtype)
    weight = torch.randn(dim, generator=gen).to(dtype)
    gate_up = torch.randn(tokens, 2 * ffn, generator=gen).to(dtype)
    qkv = torch.randn(tokens, 15 * 64, generator=gen).to(dtype)
    cos, sin = torch.randn(2, tokens, 64, generator=gen).to(dtype)

    def torch_silu():
        gate, up = gate_up.clone().chunk(2, dim=-1)  # the product is fresh in the layer: SiLU in place
        return torch.mul(F.silu(gate, inplace=True), up)

    def torch_rope():
        heads = qkv.view(tokens, 15, 64).transpose(0, 1)
        return apply_rope(heads[:12], cos, sin), heads[12:].contiguous()

    rows = [
        ("RMSNorm -> dtype, x weight", lambda: weight * F.rms_norm(h, (dim,), eps=1e-5).to(dtype),
         lambda: layer_passes.rms_norm(h, weight, 1e-5, dtype)),
        ("residual sum + next RMSNorm", lambda: weight * F.rms_norm(h + out, (dim,), eps=1e-5).to(dtype),
         lambda: layer_passes.residual(h, out, (weight, 1e-5))),
        ("residual sum", lambda: h + out, lambda: layer_passes.residual(h, out)),  # float32: in place, not in C
        ("SiLU(gate) * up (with the clone)", torch_silu, lambda: layer_passes.silu_mul(gate_up)),
        ("RoPE q, k + v head-major", torch_rope, lambda: layer_passes.rope_heads(qkv, cos, sin, 15, 12)),
    ]
    print(f"| pass, {dtype_name}, 1024 tokens | PyTorch ms | C ms | speed-up |")
    print("|---|---|---|---|")
    if dtype == torch.float32:  # a float32 output is added into in place (models/llama._residual): no C pass there
        rows = [row for row in rows if row[0] != "residual sum"]
    for name, reference, native in rows:
        if native() is None:
            print(f"| {name} | - | not run here (PyTorch's kept) | - |")
            continue
        a, b = best_s(reference, 50) * 1e3, best_s(native, 50) * 1e3
        print(f"| {name} | {a:.3f} | {b:.3f} | {a / b:.2f}x |", flush=True)


def short_requests(lines: int) -> list:
    """`lines` short lines as bench/short_lines_bench.py writes them, as requests."""
    from batch_bench import corpus

    from ilre.contract.messages import CompressRequest

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "lines.jsonl"
        corpus(path, lines, {"ratio": 0.3}, 29)
        rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [CompressRequest(context=r["context"], query=r["query"], ratio=0.3,
                            strategy_options={"first_from_stream": True}) for r in rows]


def timed(engine, requests: list, repeats: int, ways: dict[str, Callable[[], None]] | None = None
          ) -> tuple[dict[str, list[float]], dict[str, list[list[int]]]]:
    """Seconds per request of each way over `repeats` alternating runs (`ways`: name -> what switches to it; the C
    passes and PyTorch's by default); the kept indices of each way's last run."""
    ways = ways or {mode: (lambda flag=flag: os.environ.__setitem__("ILRE_NATIVE_PASSES", flag))
                    for mode, flag in MODES.items()}
    times: dict[str, list[float]] = {way: [] for way in ways}
    kept: dict[str, list[list[int]]] = {}
    for _ in range(repeats):
        for way, switch in ways.items():
            switch()
            start = time.perf_counter()
            kept[way] = [engine.compress(request).kept_indices for request in requests]
            times[way].append((time.perf_counter() - start) / len(requests))
    return times, kept


def shared(kept: dict[str, list[list[int]]], new: str = "c", old: str = "torch") -> float:
    """The share of the kept tokens both ways (`new`, `old`) keep, of `old`'s."""
    both = sum(len(set(a) & set(b)) for a, b in zip(kept[new], kept[old]))
    return both / max(sum(len(a) for a in kept[old]), 1)


def first_questions(engine, tokens: int) -> tuple[object, dict]:
    """A `tokens` passkey sample, and its first question by the default and by plain ILRe at l_R (budget 1024)."""
    from ilre.contract.messages import CompressRequest
    from ilre.evaluation.tasks.passkey import make_passkey_sample

    sample = make_passkey_sample(engine.tokenizer, tokens, 0.5, seed=7)
    return sample, {
        "default": CompressRequest(context_ids=sample.context_ids, query_ids=sample.query_ids, budget=1024,
                                   strategy_options={"first_from_stream": True}),
        "plain ILRe at l_R": CompressRequest(context_ids=sample.context_ids, query_ids=sample.query_ids, budget=1024,
                                             strategy="ilre"),
    }


def end_to_end(args) -> None:
    from ilre.engine.engine import Engine, EngineConfig
    from ilre.contract.messages import CompressRequest

    engine = Engine(EngineConfig(dtype=args.dtype, doc_cache_mb=0))
    sample, jobs = first_questions(engine, args.tokens)
    lines = short_requests(args.lines)
    engine.compress(CompressRequest(context_ids=sample.context_ids[:4096], query_ids=sample.query_ids, budget=1024))
    print(f"\n{args.tokens} tokens, {engine.placement.describe()}, the two paths alternating, {args.repeats} runs each")
    print("| request | PyTorch's operators s (median) | C passes s (median) | speed-up | kept tokens shared |")
    print("|---|---|---|---|---|")
    for name, request in jobs.items():
        times, kept = timed(engine, [request], args.repeats)
        a, b = statistics.median(times["torch"]), statistics.median(times["c"])
        print(f"| {name} | {a:.2f} | {b:.2f} | {a / b:.2f}x | {shared(kept):.1%} |", flush=True)
    times, kept = timed(engine, lines, args.repeats)
    a, b = statistics.median(times["torch"]), statistics.median(times["c"])
    print(f"| a short line (~700 tokens, ratio 0.3), of {args.lines} | {a * 1e3:.0f} ms | {b * 1e3:.0f} ms | "
          f"{a / b:.2f}x | {shared(kept):.1%} |")
    os.environ.pop("ILRE_NATIVE_PASSES")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lines", type=int, default=24)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    import torch

    from ilre.models.device import resolve_placement

    own = resolve_placement("cpu", args.dtype).describe()
    micro("bfloat16" if "bfloat16" in own else "float32")
    print(f"({torch.get_num_threads()} threads)")
    end_to_end(args)


if __name__ == "__main__":
    main()
