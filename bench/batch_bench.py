"""`ilre batch` as a corpus job, run as a user runs it: --lines lines of ~700 tokens of real text (Python's pydoc
topics, a planted fact each), through the real command on each backend:
- loop:    in process, one line at a time (`--in-flight 1`: what the batch CLI did before it was a job);
- process: in process at its defaults (16 lines in flight through the batching queue);
- serve:   `ilre serve` started beside it, the lines sent to its HTTP JSON mirror (`--server http://...`);
- redis-1, redis-2: redis-server, the CLI and 1 or 2 `ilre worker --threads 1`, each on a host of its own (network
           namespaces on one switch, tests/hosts), the lines sent to the queue over TCP (`--redis-url`).
Per arm: lines/s, context tokens/s, the CLI's peak RSS (flat in the number of lines: the serve arm also runs on a
tenth of the lines), the planted fact kept. An arm is a resumable job: --budget-s stops the bench (Ctrl-C to the
CLI) once that long has passed and the next run goes on where it stopped, its time the sum of the runs' (each
run's start-up included); rows go to --rows as each arm finishes, a rerun measures only the arms not there.

    .venv/bin/python bench/batch_bench.py [--lines 10000] [--arms loop,process,serve,redis-1,redis-2] [--budget-s S]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ilre.evaluation.tasks.haystack import pydoc_text  # noqa: E402
from ilre.models.embedded import embedded_checkpoint  # noqa: E402
from ilre.models.loader import load_tokenizer  # noqa: E402
from tests.hosts.cluster import Cluster, missing_tools  # noqa: E402
from tests.hosts.services import RedisHost, worker_on  # noqa: E402
from tests.service.conftest import free_port  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results" / "bench"
ROWS = RESULTS / "batch.jsonl"
ILRE = [str(Path(sys.executable).parent / "ilre")]
TOKENS = 700


def corpus(path: Path, lines: int, sizing: dict | None = None, offset: int = 0) -> None:
    """`lines` ilre lines of ~TOKENS tokens of pydoc text (overlapping windows: distinct contexts), a fact each;
    `sizing`: each line's budget or ratio (default budget 96); `offset`: where in the text the windows start."""
    tokenizer = load_tokenizer(embedded_checkpoint())
    ids = tokenizer(pydoc_text(), add_special_tokens=False).input_ids
    step = max(1, (len(ids) - TOKENS) // max(lines, 1))
    with path.with_suffix(".tmp").open("w") as f:
        for i in range(lines):
            start = (offset + i * step) % max(len(ids) - TOKENS, 1)
            text = tokenizer.decode(ids[start:start + TOKENS])
            cut = text.find("\n", len(text) // 2) + 1 or len(text) // 2
            text = f"{text[:cut]}The batch code of record {i} is {100000 + i}.\n{text[cut:]}"
            f.write(json.dumps({"id": f"r{i}", "context": text, "query": f"What is the batch code of record {i}?",
                                **(sizing or {"budget": 96})}) + "\n")
    path.with_suffix(".tmp").replace(path)


class Deadline:
    """When the bench stops for this run (--budget-s), or never."""

    def __init__(self, budget_s: float | None):
        self.at = time.monotonic() + budget_s if budget_s else None

    def left(self) -> float | None:
        return None if self.at is None else max(0.0, self.at - time.monotonic())


def run_batch(argv: list[str], deadline: Deadline, spawn=subprocess.Popen) -> dict:
    """The real command (SIGINT when the deadline comes: it stops after the lines written); its JSON summary plus
    its own peak RSS (MiB)."""
    proc = spawn([*argv, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err: list[bytes] = []
    threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True).start()
    if (left := deadline.left()) is not None:
        timer = threading.Timer(left, lambda: proc.poll() is None and proc.send_signal(signal.SIGINT))
        timer.daemon = True
        timer.start()
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 130):
        time.sleep(0.5)
        raise SystemExit(f"ilre batch failed ({proc.returncode}): {b''.join(err).decode()[-2000:]}")
    lines = out.decode().splitlines()
    summary = json.loads(lines[-1]) if lines else {"state": "finished", "lines": 0, "seconds": 0, "tokens_in": 0}
    return {**summary, "peak_rss_mib": round(usage.ru_maxrss / 1024, 1)}


def facts_kept(output: Path) -> int:
    kept = 0
    with output.open() as f:
        for line in f:
            record = json.loads(line)
            kept += f"is {100000 + int(record['id'][1:])}" in record.get("compressed_context", "")
    return kept


class Server:
    """An `ilre serve` process started for an arm."""

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


def segment(name: str, source: Path, small: Path, work: Path, deadline: Deadline) -> dict:
    """One run of arm `name` on `source`, going on from what its output holds."""
    output = work / f"{name}.jsonl"
    batch = [*ILRE, "batch", "--input", str(source), "--output", str(output)]
    if name == "loop":
        return run_batch([*batch, "--in-flight", "1"], deadline)
    if name == "process":
        return run_batch(batch, deadline)
    if name == "serve":
        server = Server("serve", "--grpc-port", "0", "--http-port", str(port := free_port()))
        try:
            row = run_batch([*batch, "--server", f"http://127.0.0.1:{port}"], deadline)
            if row["state"] == "finished" and not deadline.left() == 0:
                row["peak_rss_mib_tenth"] = run_batch(
                    [*ILRE, "batch", "--input", str(small), "--output", str(work / "small.jsonl"), "--restart",
                     "--server", f"http://127.0.0.1:{port}"], Deadline(None))["peak_rss_mib"]
            return row
        finally:
            server.stop()
    if reason := missing_tools():
        raise SystemExit(f"{name}: the workers' hosts cannot be made here: {reason}")
    workers = int(name.split("-")[1])
    hosts = [f"w{i}" for i in range(1, workers + 1)]
    with Cluster(["redis", "cli", *hosts]) as cluster:  # the queue, the CLI and each worker on a host of its own
        redis = RedisHost(cluster, "redis")
        for host in hosts:
            worker_on(cluster, host, redis, "bb")
        return run_batch([*batch, "--redis-url", redis.url, "--redis-prefix", "bb", "--in-flight", "32"], deadline,
                         spawn=lambda argv, **kw: cluster.spawn("cli", argv, **kw))


def arm(name: str, source: Path, small: Path, work: Path, deadline: Deadline) -> dict | None:
    """Arm `name` run on until it is done (its row) or the deadline (None); each run is a segment on file."""
    log = work / f"{name}.segments.jsonl"
    while deadline.left() != 0:
        seg = segment(name, source, small, work, deadline)
        with log.open("a") as f:
            f.write(json.dumps(seg) + "\n")
        if seg["state"] == "finished":
            break
    segments = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
    if not segments or segments[-1]["state"] != "finished":
        return None
    lines, seconds = sum(s["lines"] for s in segments), sum(s["seconds"] for s in segments)
    tokens = sum(s["tokens_in"] for s in segments)
    row = {"lines": lines, "seconds": round(seconds, 1), "runs": len(segments), "lines_per_s": lines / seconds,
           "tokens_per_s": tokens / seconds, "peak_rss_mib": max(s["peak_rss_mib"] for s in segments),
           "facts_kept": facts_kept(work / f"{name}.jsonl")}
    tenth = [s["peak_rss_mib_tenth"] for s in segments if "peak_rss_mib_tenth" in s]
    return {**row, **({"peak_rss_mib_tenth": tenth[-1]} if tenth else {})}


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
    parser.add_argument("--work", type=Path, default=RESULTS / "batch-work",
                        help="the corpus and each arm's output and runs, kept between runs (default %(default)s)")
    parser.add_argument("--budget-s", type=float, default=None, help="stop after this long; the next run goes on")
    parser.add_argument("--fresh", action="store_true")
    args = parser.parse_args()
    args.rows.parent.mkdir(parents=True, exist_ok=True)
    work = args.work / str(args.lines)
    if args.fresh:
        args.rows.unlink(missing_ok=True)
        subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir(parents=True, exist_ok=True)
    done = {r["arm"]: r for r in map(json.loads, args.rows.read_text().splitlines())} if args.rows.is_file() else {}
    done = {k: v for k, v in done.items() if v.get("lines") == args.lines}  # another size: measured again
    source, small = work / "corpus.jsonl", work / "tenth.jsonl"
    if not source.is_file():
        corpus(source, args.lines)
        corpus(small, max(1, args.lines // 10))
    deadline = Deadline(args.budget_s)
    for name in args.arms.split(","):
        if name in done:
            continue
        print(f"{name}: {args.lines} lines", flush=True)
        row = arm(name, source, small, work, deadline)
        if row is None:
            print(f"  stopped at the time budget; the next run goes on ({work})", flush=True)
            break
        done[name] = {"arm": name, **row}
        with args.rows.open("a") as f:
            f.write(json.dumps(done[name]) + "\n")
        print(f"  {done[name]['lines_per_s']:.2f} lines/s", flush=True)
    summary({name: done[name] for name in args.arms.split(",") if name in done})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
