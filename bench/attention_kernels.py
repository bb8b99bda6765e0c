"""Why the bfloat16 prefill stops near half the matmul peak: one prefill chunk's attention (the
embedded model's 9 query / 3 KV heads, head size 64; 1024 queries over the S + W = 516 cached
keys plus themselves, causally) timed with the kernel ilre uses and with the alternatives tried.
Prints ms per chunk and layer, score elements per second and GFLOP/s (4 * d FLOPs per score element).
Usage: bench/attention_kernels.py [--repeats 10]
"""

from __future__ import annotations

import argparse
import time

import torch

from ilre.kernels.chunk_attention import chunk_attention, torch_chunk_attention

HEADS, KV_HEADS, CHUNK, PREFIX, DIM = 9, 3, 1024, 516, 64
FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def best_ms(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    torch.manual_seed(0)
    dt = torch.bfloat16
    q = torch.randn(HEADS, CHUNK, DIM, dtype=dt)
    k, v = (torch.randn(KV_HEADS, PREFIX + CHUNK, DIM, dtype=dt) for _ in range(2))
    q4, kp, vp = q.unsqueeze(0), k[:, :PREFIX].unsqueeze(0), v[:, :PREFIX].unsqueeze(0)
    group = HEADS // KV_HEADS

    def bmm_prefix():  # fp32 scores, softmax, bf16 weights times values: plain matmuls
        scores = torch.bmm(q.view(KV_HEADS, group * CHUNK, DIM).float() * DIM ** -0.5, k[:, :PREFIX].float().transpose(1, 2))
        return torch.bmm(torch.softmax(scores, -1).to(dt), v[:, :PREFIX])

    prefix_elems = HEADS * CHUNK * PREFIX
    causal_elems = HEADS * CHUNK * (CHUNK + 1) // 2
    cases = [
        ("whole chunk, as ilre runs it (the C kernel where preferred)", lambda: chunk_attention(q, k, v, PREFIX),
         prefix_elems + causal_elems),
        ("whole chunk, PyTorch's (flash prefix + flash causal)", lambda: torch_chunk_attention(q, k, v, PREFIX),
         prefix_elems + causal_elems),
        ("  prefix only (flash, no mask)", lambda: FLASH(q4, kp, vp, 0.0, False), prefix_elems),
        ("  chunk only (flash, causal)", lambda: FLASH(q4, k[:, PREFIX:].unsqueeze(0), v[:, PREFIX:].unsqueeze(0), 0.0, True),
         causal_elems),
        ("  prefix, GQA group folded into the queries", lambda: FLASH(q.view(1, KV_HEADS, group * CHUNK, DIM), kp, vp, 0.0, False),
         prefix_elems),
        ("  prefix as fp32 bmm + softmax + bf16 bmm", bmm_prefix, prefix_elems),
    ]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, bfloat16")
    print(f"| {'attention of one chunk and layer':<58} | {'ms':>7} | {'G elements/s':>12} | {'GFLOP/s':>8} |")
    for name, fn, elems in cases:
        ms = best_ms(fn, args.repeats)
        print(f"| {name:<58} | {ms:7.1f} | {elems / ms / 1e6:12.2f} | {4 * DIM * elems / ms / 1e6:8.0f} |")


if __name__ == "__main__":
    main()
