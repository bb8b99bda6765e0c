"""A deepened document's query scores with DCA: what a follow-up pays per score layer once the document is deepened.

The embedded model's shapes (9 query / 3 KV heads, head size 64), keys of a 32K and a 128K context in chunks of 1,024
(DCA moves every chunk but the last two, eq. 7), queries of 15 and 64 tokens. Side by side: the keys moved as a copy
and scored in blocks of 8,192 (the way before), and the query moved back per chunk instead (kernels/rope.MovedKeys,
blocks of 2,048, nothing copied). Prints ms per layer, the speed-up, the bytes the copy took and the largest score
difference.
Usage: bench/query_scores_bench.py [--lengths 32768,131072] [--repeats 5]
"""

from __future__ import annotations

import argparse

import torch

from attention_kernels import best_ms  # bench/: the script's own folder is on the path
from ilre.compressor.context_state import dca_spans
from ilre.compressor.prefill_config import PrefillConfig
from ilre.kernels.query_scores import query_key_scores
from ilre.kernels.rope import MovedKeys

HEADS, KV_HEADS, DIM = 9, 3, 64
INV_FREQ = 1.0 / 100000.0 ** (torch.arange(0, DIM, 2, dtype=torch.float32) / DIM)  # the embedded model's base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="32768,131072")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    config = PrefillConfig(sink=4, window=512, chunk=1024, dca=True)
    print(f"threads {torch.get_num_threads()}; keys float32, chunks of {config.chunk}, DCA on")
    print("| context | query tokens | moved copy + blocks of 8,192 ms | query moved per chunk ms | speed-up | copy MiB "
          "| max |diff| |")
    print("|---|---|---|---|---|---|---|")
    generator = torch.Generator().manual_seed(0)
    for length in (int(x) for x in args.lengths.split(",") if x):
        keys = torch.randn(KV_HEADS, length, DIM, generator=generator)
        moved = MovedKeys(keys, dca_spans(length, config), INV_FREQ)  # as the engine's score_keys makes them
        for n_query in (15, 64):
            q = torch.randn(HEADS, n_query, DIM, generator=generator)
            before = best_ms(lambda: query_key_scores(q, moved.moved(), block=8192), args.repeats)
            now = best_ms(lambda: query_key_scores(q, moved), args.repeats)
            diff = (query_key_scores(q, moved) - query_key_scores(q, moved.moved(), block=8192)).abs().max().item()
            print(f"| {length} | {n_query} | {before:.1f} | {now:.1f} | {before / now:.2f}x | "
                  f"{keys.numel() * 4 / 2**20:.0f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
