"""`ilre batch` as a corpus job, run as a user runs it: --lines lines of ~700 tokens of real text (Python's pydoc
topics, a planted fact each), through the real command on each backend:
- loop:    in process, one line at a time (`--in-flight 1`: what the batch CLI did before it was a job);
- process: in process at its defaults (16 lines in flight through the batching queue);
- serve:   `ilre serve` started beside it, the lines sent to its HTTP JSON mirror (`--server http://...`);
- redis-1, redis-2: a redis-server and 1 or 2 `ilre worker --threads 1` processes, the lines sent to the queue
           (`--redis-url`); on one host over loopback (workers on hosts of their own: network namespaces, not yet).
Per arm: lines/s, context tokens/s, the CLI's peak RSS (flat in the number of lines: the serve arm also runs on a
tenth of the lines), the planted fact kept. Rows go to --rows as each arm finishes; a rerun measures only the arms
not there (--fresh: all again).

    .venv/bin/python bench/batch_bench.py [--lines 10000] [--arms loop,process,serve,redis-1,redis-2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ilre.evaluation.tasks.haystack import pydoc_text  # noqa: E402
from ilre.models.embedded import embedded_checkpoint  # noqa: E402
from ilre.models.loader import load_tokenizer  # noqa: E402
from tests.service.conftest import RedisServer, WorkerProcess, free_port  # noqa: E402

ROWS = Path(__file__).resolve().parents[1] / "results" / "bench" / "batch.jsonl"
ILRE = [str(Path(sys.executable).parent / "ilre")]
TOKENS = 700


def corpus(path: Path, lines: int) -> None:
    """`lines` ilre lines of ~TOKENS tokens of pydoc text (overlapping windows: distinct contexts), a fact each."""
    tokenizer = load_tokenizer(embedded_checkpoint())
    ids = tokenizer(pydoc_text(), add_special_tokens=False).input_ids
    step = max(1, (len(ids) - TOKENS) // max(lines, 1))
    with path.open("w") as f:
        for i in range(lines):
            start = (i * step) % max(len(ids) - TOKENS, 1)
            text = tokenizer.decode(ids[start:start + TOKENS])
            cut = text.find("\n", len(text) // 2) + 1 or len(text) // 2
            text = f"{text[:cut]}The batch code of record {i} is {100000 + i}.\n{text[cut:]}"
            f.write(json.dumps({"id": f"r{i}", "context": text, "query": f"What is the batch code of record {i}?",
                                "budget": 96}) + "\n")


def run_batch(source: Path, output: Path, *flags: str) -> dict:
    """The real command; its JSON summary plus the CLI's own peak RSS (MiB) and how many facts it kept."""
    proc = subprocess.Popen([*ILRE, "batch", "--input", str(source), "--output", str(output), "--restart", "--json",
                             *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err: list[bytes] = []
    threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True).start()
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        time.sleep(0.5)
        raise SystemExit(f"ilre batch failed ({proc.returncode}): {b''.join(err).decode()[-2000:]}")
    summary = json.loads(out.decode().splitlines()[-1])
    kept = 0
    with output.open() as f:
        for line in f:
            record = json.loads(line)
            kept += f"is {100000 + int(record['id'][1:])}" in record.get("compressed_context", "")
    return {**summary, "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "facts_kept": kept}


class Server:
    """An `ilre` server process (serve or worker) started for an arm."""

    def __init__(self, *args: str, ready: str = "ilre: "):
        self.proc = subprocess.Popen([*ILRE, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "ILRE_LOG_LEVEL": "info"})
        self.lines: list[str] = []
        threading.Thread(target=lambda: [self.lines.append(l) for l in self.proc.stderr], daemon=True).start()
        deadline = time.monotonic() + 300
        while not any(ready in l for l in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{args[0]} did not start: " + "".join(self.lines)[-2000:])
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def arm(name: str, source: Path, small: Path, work: Path) -> dict:
    output = work / f"{name}.jsonl"
    if name == "loop":
        return run_batch(source, output, "--in-flight", "1")
    if name == "process":
        return run_batch(source, output)
    if name == "serve":
        server = Server("serve", "--grpc-port", "0", "--http-port", str(port := free_port()))
        try:
            row = run_batch(source, output, "--server", f"http://127.0.0.1:{port}")
            row["peak_rss_mib_tenth"] = run_batch(small, work / "small.jsonl", "--server", f"http://127.0.0.1:{port}")[
                "peak_rss_mib"]
            return row
        finally:
            server.stop()
    workers = int(name.split("-")[1])
    (work / name).mkdir()
    redis = RedisServer(work / name)  # its own directory: no queue or cached document of another arm
    redis.start()
    started = [WorkerProcess(redis.url, "bb", f"w{i}") for i in range(workers)]  # one thread each
    try:
        for worker in started:
            worker.wait_registered(redis.client())
        return run_batch(source, output, "--redis-url", redis.url, "--redis-prefix", "bb", "--in-flight", "32")
    finally:
        for worker in started:
            worker.stop()
        redis.stop()


def summary(rows: dict[str, dict]) -> None:
    print("\n| arm | lines | lines/s | context tokens/s | CLI peak RSS MiB | facts kept |")
    print("|---|---|---|---|---|---|")
    for name, row in rows.items():
        rss = f"{row['peak_rss_mib']}" + (f" ({row['peak_rss_mib_tenth']} at a tenth)" if "peak_rss_mib_tenth" in row else "")
        print(f"| {name} | {row['lines']} | {row['lines_per_s']:.2f} | {row['tokens_per_s']:,.0f} | {rss} | "
              f"{row['facts_kept']}/{row['lines']} |")
    if "redis-1" in rows and "redis-2" in rows:
        print(f"\n2 workers / 1: {rows['redis-2']['lines_per_s'] / rows['redis-1']['lines_per_s']:.2f}x")
    if "loop" in rows and "process" in rows:
        print(f"in process, 16 in flight / one at a time: {rows['process']['lines_per_s'] / rows['loop']['lines_per_s']:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--arms", default="loop,process,serve,redis-1,redis-2")
    parser.add_argument("--rows", type=Path, default=ROWS)
    parser.add_argument("--fresh", action="store_true")
    args = parser.parse_args()
    args.rows.parent.mkdir(parents=True, exist_ok=True)
    if args.fresh:
        args.rows.unlink(missing_ok=True)
    done = {r["arm"]: r for r in map(json.loads, args.rows.read_text().splitlines())} if args.rows.is_file() else {}
    done = {k: v for k, v in done.items() if v.get("lines") == args.lines}  # another size: measured again
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        source, small = work / "corpus.jsonl", work / "tenth.jsonl"
        corpus(source, args.lines)
        corpus(small, max(1, args.lines // 10))
        for name in args.arms.split(","):
            if name in done:
                continue
            print(f"{name}: {args.lines} lines", flush=True)
            done[name] = {"arm": name, **arm(name, source, small, work)}
            with args.rows.open("a") as f:
                f.write(json.dumps(done[name]) + "\n")
            print(f"  {done[name]['lines_per_s']:.2f} lines/s", flush=True)
    summary({name: done[name] for name in args.arms.split(",") if name in done})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
