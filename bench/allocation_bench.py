"""Algorithm 1's allocation (compressor/allocation.py) with a short context's pooled rows ranked by one sort of all of
them, against each row ranked alone (ROWS_SORTED = 0, as before): best of 20 calls at each length and budget, and
whether the kept indices are the same.

    .venv/bin/python bench/allocation_bench.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stage_limits import best_s  # noqa: E402

CASES = ((700, 210), (700, 96), (4096, 1024), (32768, 1024), (131072, 4096))


def main() -> None:
    import torch

    from ilre.compressor import allocation

    allocator, sorted_rows = allocation.PoolingAllocator(), allocation.ROWS_SORTED
    print(f"Algorithm 1, the paper's 48 kernels, {torch.get_num_threads()} threads")
    print("| context | budget | each row alone ms | short rows together ms | speed-up | same indices |")
    print("|---|---|---|---|---|---|")
    for length, budget in CASES:
        scores = torch.rand(length, generator=torch.Generator().manual_seed(length))
        times, kept = {}, {}
        for way, rows in (("alone", 0), ("together", sorted_rows)):
            allocation.ROWS_SORTED = rows
            times[way] = best_s(lambda: allocator.allocate(scores, budget), 20)
            kept[way] = allocator.allocate(scores, budget)
        allocation.ROWS_SORTED = sorted_rows
        print(f"| {length} | {budget} | {times['alone'] * 1e3:.2f} | {times['together'] * 1e3:.2f} | "
              f"{times['alone'] / times['together']:.2f}x | {torch.equal(kept['alone'], kept['together'])} |")


if __name__ == "__main__":
    main()
