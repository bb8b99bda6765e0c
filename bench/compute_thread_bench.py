"""Where an engine's kernels run: --lines ilre lines of ~700 tokens of pydoc text (batch_bench's corpus), each
arm in a fresh process (what a server or `ilre batch` is), the arms alternated --repeats times:
- engine thread: `Engine.compress` called from a queue's thread, as the service and `ilre batch` call it: the
                 engine hands the work to the thread it loaded the model on (engine/compute_thread.py);
- other thread:  the engine's work run on the queue's thread itself (`Engine._run`), the model loaded on
                 another: what every queue did before (measured there: prefill 20-25% slower).
Prints mean prefill ms per line and lines/s of each (after a warm-up of 8 lines).

    .venv/bin/python bench/compute_thread_bench.py [--lines 40] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

ARMS = ("engine thread", "other thread")


def run_arm(arm: str, lines: Path) -> dict:
    """In this process: the arm's lines, timed."""
    from ilre.engine.engine import Engine, EngineConfig
    from ilre.contract.messages import CompressRequest

    requests = [CompressRequest.from_json(json.loads(line), {}) for line in lines.open()]
    engine = Engine(EngineConfig())
    queue = ThreadPoolExecutor(1, thread_name_prefix="queue")
    call = engine.compress if arm == "engine thread" else (lambda r: engine._run(r, "").wire())
    for request in requests[:8]:
        queue.submit(call, request).result()
    start, prefill = time.perf_counter(), []
    for request in requests:
        prefill.append(queue.submit(call, request).result().timings_ms["prefill"])
    return {"seconds": time.perf_counter() - start, "prefill_ms": sum(prefill) / len(prefill), "lines": len(requests),
            "dtype": engine.placement.dtype_name}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(run_arm(args.arm, args.corpus)))
        return 0
    from batch_bench import corpus

    rows: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        lines = Path(tmp) / "lines.jsonl"
        corpus(lines, args.lines)
        for _ in range(args.repeats):
            for arm in ARMS:
                out = subprocess.run([sys.executable, __file__, "--arm", arm, "--corpus", str(lines)],
                                     capture_output=True, text=True, check=True).stdout
                rows[arm].append(json.loads(out.splitlines()[-1]))
    print(f"\n{args.lines} lines, {args.repeats} processes an arm, {rows[ARMS[0]][0]['dtype']}\n")
    print("| arm | prefill ms/line (each process) | lines/s |\n|---|---|---|")
    for arm, runs in rows.items():
        each = ", ".join(f"{r['prefill_ms']:.0f}" for r in runs)
        print(f"| {arm} | {sum(r['prefill_ms'] for r in runs) / len(runs):.0f} ({each}) | "
              f"{sum(r['lines'] for r in runs) / sum(r['seconds'] for r in runs):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
