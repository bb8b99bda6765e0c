"""`make bench`: what storing a document costs as the in-process document cache fills, now and at a commit before.

A long job (`ilre batch` over a corpus, a server up for days) leaves the cache holding many documents whose states
went under the byte cap and whose IDs stay (a few KiB each, so that a later request may name them by id). Per
count N of such documents held: a cache of --cap-mib filled with N one-off documents of --tokens tokens, each stored
with a real encoding of the embedded model at layer 8 in bfloat16 (states evicted under the cap as they come),
then --stores more documents stored the same way: the median milliseconds of one store (its IDs, then its state:
`DocumentCache.remember` + `DocumentCache.state`, eviction included). The same script runs on the tree of
--before (a git worktree made in a temporary folder, on PYTHONPATH) for the counts up to --before-max, in the same
run: the cache before it kept its byte counts as it changed read every held document on each store.

    .venv/bin/python bench/doc_cache_bench.py [--counts 1000,10000,30000,100000] [--before 9c8484a]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "bench" / "doc_cache.txt"


def measure(counts: list[int], tokens: int, cap_mib: int, stores: int) -> list[dict]:
    """Per count: the median ms of one store once the cache holds that many documents (this tree's ilre)."""
    import torch

    from ilre.compressor.prefill import encode_context
    from ilre.compressor.prefill_config import PrefillConfig
    from ilre.engine.documents import DocumentCache
    from ilre.models.embedded import embedded_checkpoint
    from ilre.models.loader import load_truncated

    model = load_truncated(embedded_checkpoint(), 8, torch.bfloat16)  # the default's coarse layer
    gen = torch.Generator().manual_seed(0)
    state = encode_context(model, torch.randint(100, 40000, (tokens,), generator=gen), PrefillConfig())
    rows, cache, held = [], DocumentCache(cap_mib << 20), 0

    def store(n: int) -> float:
        ids = torch.full((tokens,), n, dtype=torch.int64)
        start = time.perf_counter()
        cache.remember(f"doc{n}", ids)
        cache.state(f"doc{n}", "k", lambda: state, None)
        return time.perf_counter() - start

    for count in sorted(counts):
        while held < count:
            store(held)
            held += 1
        times = [store(held + i) for i in range(stores)]
        held += stores
        rows.append({"held": count, "store_ms": 1000 * statistics.median(times), "states_held": sum(
            1 for entry in cache._docs.values() if entry.states), "state_mib": state.nbytes / 2**20})
    return rows


def before(rev: str, counts: list[int], args: argparse.Namespace) -> list[dict]:
    """`measure` on the tree of `rev` (a worktree in a temporary folder, this script run there as a child)."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev], check=True,
                       capture_output=True)
        try:
            out = subprocess.run([sys.executable, __file__, "--child", "--counts", ",".join(map(str, counts)),
                                  "--tokens", str(args.tokens), "--cap-mib", str(args.cap_mib),
                                  "--stores", str(args.stores)], check=True, capture_output=True, text=True,
                                 env={**os.environ, "PYTHONPATH": str(tree / "src")}).stdout
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    return json.loads(out.splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1000,10000,30000,100000")
    parser.add_argument("--tokens", type=int, default=700)
    parser.add_argument("--cap-mib", type=int, default=1024, help="the cache's cap (the default --doc-cache-mb)")
    parser.add_argument("--stores", type=int, default=50)
    parser.add_argument("--before", default="9c8484a", help="the commit to compare with ('' : none)")
    parser.add_argument("--before-max", type=int, default=30000, help="the largest count run on --before")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",") if c]
    if args.child:
        print(json.dumps(measure(counts, args.tokens, args.cap_mib, args.stores)))
        return 0
    now = measure(counts, args.tokens, args.cap_mib, args.stores)
    old = {r["held"]: r for r in before(args.before, [c for c in counts if c <= args.before_max], args)} \
        if args.before else {}
    lines = [f"one store into a {args.cap_mib} MiB cache holding N documents of {args.tokens} tokens "
             f"(state {now[0]['state_mib']:.2f} MiB; median of {args.stores})",
             f"| documents held | store now (ms) | at {args.before or '-'} (ms) | documents holding a state |",
             "|---|---|---|---|"]
    for row in now:
        was = f"{old[row['held']]['store_ms']:.2f}" if row["held"] in old else "-"
        lines.append(f"| {row['held']:,} | {row['store_ms']:.2f} | {was} | {row['states_held']:,} |")
    print("\n".join(lines))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
