"""The C chunk-attention kernel (ilre.kernels.native_attention) against `torch_chunk_attention` (PyTorch's
CPU flash kernel) on the embedded model's heads (9 query / 3 KV heads, head size 64), in bfloat16
and float32: causal 384 and 718 rows, a chunk of 1024 rows over 516 prefix keys plus itself, and a chunk
of 11 rows over 516 + 11 keys. Prints ms per call (the best of --repeats calls), GFLOP/s
(4 * d FLOPs per visible score element) and the speed-up.
Usage: bench/native_attention_bench.py [--repeats 15] [--threads N]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stage_limits import best_s  # noqa: E402

from ilre.kernels.chunk_attention import torch_chunk_attention  # noqa: E402
from ilre.kernels.native_attention import available, native_chunk_attention  # noqa: E402

HEADS, KV_HEADS, DIM = 9, 3, 64
SHAPES = [  # name, prefix keys, chunk rows
    ("causal 384", 0, 384), ("causal 718", 0, 718), ("1024 over 516+1024", 516, 1024), ("11 over 516+11", 516, 11),
]


def best_ms(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` timed calls after a warm-up one (the least disturbed by other jobs), in ms."""
    return best_s(fn, repeats) * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    if not available():
        raise SystemExit("the native kernel is not available (no gcc or a failed build)")
    print(f"build/load: {time.perf_counter() - start:.2f} s; threads: {torch.get_num_threads()}")
    print(f"{'dtype':9} {'shape':20} {'torch ms':>9} {'GFLOP/s':>8} {'native ms':>10} {'GFLOP/s':>8} {'speed-up':>8}")
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        for name, n_prefix, n_rows in SHAPES:
            q = torch.randn(HEADS, n_rows, DIM, dtype=dtype)
            k, v = (torch.randn(KV_HEADS, n_prefix + n_rows, DIM, dtype=dtype) for _ in range(2))
            scores = HEADS * (n_rows * n_prefix + n_rows * (n_rows + 1) // 2)  # visible score elements
            gflop = 4 * DIM * scores / 1e9
            t_torch = best_ms(lambda: torch_chunk_attention(q, k, v, n_prefix), args.repeats)
            t_native = best_ms(lambda: native_chunk_attention(q, k, v, n_prefix), args.repeats)
            print(
                f"{str(dtype).removeprefix('torch.'):9} {name:20} {t_torch:9.3f} {gflop / t_torch * 1e3:8.1f} "
                f"{t_native:10.3f} {gflop / t_native * 1e3:8.1f} {t_torch / t_native:7.2f}x"
            )


if __name__ == "__main__":
    main()
