"""`make soak`: an hour of mixed traffic against a front end, two workers and Redis, all real processes.

Traffic (--clients concurrent callers over gRPC and HTTP): short contexts (~300 tokens) and long
ones (~6K), several questions in one request, later questions by document_id, bad requests (each
must be INVALID_ARGUMENT or NOT_FOUND naming its field), and cancellations (a deadline too short to
make, and callers that hang up mid-call). Every answer is checked against the engine run directly in
this process (unique "fresh" documents: budget met, indices sorted). The workers' document caches
are small (64 MiB in process, 128 MiB shared on Redis) so that they are full after the warm-up. Every --restart-minutes one of the two workers is restarted (SIGTERM, every third time
SIGKILL, whose entries the other reclaims); the other worker, the front end and Redis live through
the whole run, and their RSS is sampled every 15 s.

"Nothing lost": every request that was not meant to fail gets its correct answer. "No leak": after
the warm-up, each long-lived process's RSS stays within 10% (max over min of its per-window medians).
Writes results/soak/summary.md, windows.json (per-window counts, latency percentiles and RSS) and
soak.png (latency percentiles and RSS over time).
Usage: bench/soak.py [--minutes 60] [--clients 6] [--restart-minutes 4] [--warmup-minutes 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ilre.contract.messages import CompressRequest  # noqa: E402
from ilre.engine.engine import Engine  # noqa: E402
from ilre.evaluation.tasks.passkey import make_passkey_sample  # noqa: E402
from ilre.service.client import AsyncClient, ClientError  # noqa: E402
from ilre.service.common.redis_connection import sync_client  # noqa: E402
from tests.service.redis_group import SentinelGroup  # noqa: E402

KINDS = {"short": 45, "long": 8, "fresh": 6, "queries": 7, "document": 8, "bad": 14, "deadline": 6, "hangup": 6}  # weights
MEANT_TO_SUCCEED = ("short", "long", "fresh", "queries", "document")
WINDOW_S = 60
# small document caches, so that unique documents fill them early and a flat RSS shows they stay bounded
CACHES = ("--doc-cache-mb", "64", "--doc-cache-shared-mb", "128")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def comparable(result) -> dict:
    return {k: v for k, v in result.to_dict().items() if k not in ("timings_ms", "id")}


class Cluster:
    """redis-server (AOF on), `ilre serve --redis-url`, and two `ilre worker` processes (`front`, `worker`: more
    arguments of each). With `sentinel`, Redis is a Sentinel group instead (a master, two replicas, three
    sentinels: tests/service/redis_group.py) and every process is given its redis+sentinel:// URL."""

    def __init__(self, directory: Path, front: tuple[str, ...] = (), worker: tuple[str, ...] = CACHES,
                 sentinel: bool = False):
        self.dir, self.worker_args, self.group = directory, worker, None
        self.grpc_port, self.http_port = free_port(), free_port()
        if sentinel:
            self.group = SentinelGroup(directory / "redis")
            self.url = self.group.url
        else:
            self.redis_port = free_port()
            self.url = f"redis://127.0.0.1:{self.redis_port}/0"
            binary = shutil.which("redis-server")
            if binary is None:
                raise SystemExit("soak: redis-server not found (`make tools` installs one)")
            self.redis_command = [binary, "--port", str(self.redis_port), "--bind", "127.0.0.1", "--dir",
                                  str(directory), "--appendonly", "yes", "--save", ""]
            self.redis = subprocess.Popen(self.redis_command, stdout=subprocess.DEVNULL)
        self.front = self._spawn("front", "serve", "--grpc-port", str(self.grpc_port), "--http-port", str(self.http_port),
                                 "--max-queue", "128", "--log-format", "json", *front)
        self.workers = {name: self._worker(name) for name in ("steady", "restarted-0")}
        self.restarts = self.failovers = 0

    def redis_client(self) -> redis.Redis:
        """A client of the current master (it follows a failover in Sentinel mode)."""
        return sync_client(self.url, socket_timeout=5)

    def redis_pid(self) -> int:
        if self.group is None:
            return self.redis.pid
        port = self.group.master_port()
        return self.group.node(port).proc.pid if port else self.group.master.proc.pid

    def _spawn(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.dir / f"{name}.log", "ab")
        return subprocess.Popen([sys.executable, "-m", "ilre.cli", *args, "--redis-url", self.url],
                                stdout=log, stderr=subprocess.STDOUT)

    def _worker(self, name: str) -> subprocess.Popen:
        return self._spawn(name, "worker", "--name", name, "--threads", "1", "--claim-idle-ms", "5000", "--log-format", "json",
                           *self.worker_args)

    def wait_ready(self) -> None:
        client = self.redis_client()
        give_up = time.monotonic() + 300
        while time.monotonic() < give_up:
            try:
                if len(list(client.scan_iter("ilre:worker:*"))) >= 2 and \
                        httpx.get(f"http://127.0.0.1:{self.http_port}/readyz").status_code == 200:
                    return
            except (redis.RedisError, httpx.HTTPError):
                pass
            time.sleep(0.5)
        raise SystemExit("soak: the cluster did not become ready in 300 s")

    def restart_worker(self) -> str:
        """Replace the restarted worker: SIGTERM (graceful), every third time SIGKILL."""
        old_name = next(n for n in self.workers if n != "steady")
        old = self.workers.pop(old_name)
        self.restarts += 1
        how = "SIGKILL" if self.restarts % 3 == 0 else "SIGTERM"
        old.send_signal(signal.SIGKILL if how == "SIGKILL" else signal.SIGTERM)
        old.wait(120)
        self.workers[f"restarted-{self.restarts}"] = self._worker(f"restarted-{self.restarts}")
        return how

    def restart_redis(self) -> str:
        """Stop redis-server (SIGTERM: it writes its AOF) and start it again on the same port and data. In
        Sentinel mode, a failover instead: the master killed (SIGKILL, every other time SIGTERM), a replica
        promoted, and the old master started again on its data (the sentinels make it a replica)."""
        if self.group is None:
            self.redis.send_signal(signal.SIGTERM)
            self.redis.wait(120)
            self.redis = subprocess.Popen(self.redis_command, stdout=subprocess.DEVNULL)
            return "Redis restart"
        self.failovers += 1
        how = "SIGKILL" if self.failovers % 2 else "SIGTERM"
        old_port = self.group.master_port()
        node = self.group.node(old_port)
        node.proc.send_signal(signal.SIGKILL if how == "SIGKILL" else signal.SIGTERM)
        node.proc.wait(120)
        started = time.monotonic()
        while self.group.master_port() in (None, old_port):
            if time.monotonic() - started > 120:
                raise SystemExit("soak: no replica was promoted within 120 s")
            time.sleep(0.2)
        promoted = time.monotonic() - started
        node.start()
        return f"Sentinel failover (master {how}, promoted in {promoted:.1f} s)"

    def pids(self) -> dict[str, int]:
        """The processes sampled, by role (the restarted worker's left out while a restart replaces it)."""
        out = {"front end": self.front.pid, "redis": self.redis_pid(), "steady worker": self.workers["steady"].pid}
        restarted = [p.pid for n, p in list(self.workers.items()) if n != "steady"]
        return out | ({"restarted worker": restarted[0]} if restarted else {})

    def keep_logs(self, folder: Path) -> None:
        """Copy the processes' logs to `folder`."""
        folder.mkdir(parents=True, exist_ok=True)
        for log in self.dir.glob("*.log"):
            shutil.copy(log, folder / log.name)

    def stop(self) -> None:
        redis_procs = () if self.group else (self.redis,)
        for proc in (*self.workers.values(), self.front, *redis_procs):
            proc.send_signal(signal.SIGTERM)
        for proc in (*self.workers.values(), self.front, *redis_procs):
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.group is not None:
            self.group.stop()


class Traffic:
    """The request mix and the expected answers (the engine run directly)."""

    def __init__(self, engine: Engine):
        tok = self.tokenizer = engine.tokenizer
        self.short = [make_passkey_sample(tok, 300, (i % 10) / 10, seed=i) for i in range(12)]
        self.long = [make_passkey_sample(tok, 6000, (i % 4) / 4, seed=100 + i) for i in range(3)]
        self.expected: dict[tuple, dict] = {}
        for group, budget in ((self.short, 64), (self.long, 512)):
            for i, s in enumerate(group):
                result = engine.compress(CompressRequest(context_ids=s.context_ids, query_ids=s.query_ids, budget=budget))
                self.expected[(budget, i)] = comparable(result)
        self.documents: dict[int, str] = {}  # short sample -> document_id seen in an answer

    async def one(self, kind: str, grpc: AsyncClient, http: httpx.AsyncClient, rng: random.Random) -> tuple[str, bool]:
        """Send one request of `kind` -> (status code name, whether the answer was right)."""
        i = rng.randrange(len(self.short))
        s = self.short[i]
        try:
            if kind in ("short", "document"):
                if kind == "document" and i in self.documents:
                    result = await grpc.compress(None, s.query_ids, document_id=self.documents[i], budget=64)
                else:
                    result = await grpc.compress(s.context_ids, s.query_ids, budget=64)
                    self.documents[i] = result.document_id
                return "OK", comparable(result) == self.expected[(64, i)]
            if kind == "long":
                j = rng.randrange(len(self.long))
                result = await grpc.compress(self.long[j].context_ids, self.long[j].query_ids, budget=512)
                return "OK", comparable(result) == self.expected[(512, j)]
            if kind == "fresh":  # a document never seen: a real prefill every time, and the caches fill up
                sample = make_passkey_sample(self.tokenizer, 3000, rng.random(), seed=rng.randrange(1 << 30))
                result = await grpc.compress(sample.context_ids, sample.query_ids, budget=256)
                kept = result.kept_indices
                return "OK", result.compressed_tokens == 256 and kept == sorted(set(kept))
            if kind == "queries":
                results = await grpc.compress_queries(s.context_ids, [s.query_ids] * 3, budget=64)
                return "OK", all(comparable(r) == self.expected[(64, i)] for r in results.results)
            if kind == "bad":
                body = rng.choice([{"context": "", "query": "q"}, {"context": "abc", "query": "q", "budget": -3},
                                   {"context": "abc", "query": "q", "strategy": "nope"},
                                   {"document_id": "0" * 32, "query": "q"}])
                reply = await http.post("/v1/compress", json=body)
                data = reply.json()
                return data.get("code", str(reply.status_code)), reply.status_code in (400, 404) and bool(data.get("field"))
            if kind == "deadline":
                j = rng.randrange(len(self.long))
                await grpc.compress(self.long[j].context_ids, self.long[j].query_ids, budget=512, timeout=0.05)
                return "OK", True
            task = asyncio.ensure_future(grpc.compress(self.long[0].context_ids, self.long[0].query_ids, budget=512))
            await asyncio.sleep(rng.uniform(0.01, 0.3))  # hangup: the caller goes away mid-call
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                return "CANCELLED", True
            return "OK", True
        except ClientError as exc:
            return exc.code, kind == "deadline" and exc.code == "DEADLINE_EXCEEDED"


async def drive(args, cluster: Cluster, traffic: Traffic, out: dict) -> None:
    start = time.monotonic()
    end = start + args.minutes * 60
    kinds, weights = list(KINDS), list(KINDS.values())

    async def caller(n: int) -> None:
        local = random.Random(n)
        async with AsyncClient(f"127.0.0.1:{cluster.grpc_port}", timeout=300) as grpc, \
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{cluster.http_port}", timeout=300) as http:
            while time.monotonic() < end:
                kind = local.choices(kinds, weights)[0]
                sent = time.monotonic()
                code, right = await traffic.one(kind, grpc, http, local)
                out["requests"].append({"t": sent - start, "kind": kind, "code": code, "right": right,
                                        "seconds": time.monotonic() - sent})

    async def sampler() -> None:
        next_restart = start + args.restart_minutes * 60
        while time.monotonic() < end:
            now = time.monotonic()
            out["rss"].append({"t": now - start, **{name: rss_mib(pid) for name, pid in cluster.pids().items()}})
            if now >= next_restart:
                how = await asyncio.to_thread(cluster.restart_worker)
                out["restarts"].append({"t": now - start, "how": how})
                next_restart += args.restart_minutes * 60
            await asyncio.sleep(15)

    await asyncio.gather(sampler(), *(caller(n) for n in range(args.clients)))


def summarise(args, out: dict, results: Path) -> str:
    reqs, windows = out["requests"], defaultdict(list)
    for r in reqs:
        windows[int(r["t"] // WINDOW_S)].append(r)
    rows = []
    for w in sorted(windows):
        good = sorted(r["seconds"] for r in windows[w] if r["kind"] in MEANT_TO_SUCCEED and r["code"] == "OK")
        pick = lambda q: round(good[min(len(good) - 1, int(q * len(good)))] * 1000) if good else None  # noqa: E731
        rss = [x for x in out["rss"] if w * WINDOW_S <= x["t"] < (w + 1) * WINDOW_S]
        rows.append({"minute": w, "requests": len(windows[w]), "p50_ms": pick(0.5), "p95_ms": pick(0.95),
                     "p99_ms": pick(0.99), "rss_mib": {k: _median([x[k] for x in rss]) for k in (rss[0] if rss else {})
                                                       if k != "t"}})
    (results / "windows.json").write_text(json.dumps(rows, indent=1) + "\n")
    by_code = Counter((r["kind"], r["code"]) for r in reqs)
    lost = [r for r in reqs if r["kind"] in MEANT_TO_SUCCEED and r["code"] != "OK"]
    wrong = [r for r in reqs if not r["right"] and r["kind"] != "deadline"]
    warm = [row for row in rows if row["minute"] >= args.warmup_minutes]
    leaks = {}
    for name in ("front end", "redis", "steady worker"):
        medians = [row["rss_mib"].get(name) for row in warm if row["rss_mib"].get(name)]
        if medians:
            leaks[name] = (min(medians), max(medians), max(medians) / min(medians) - 1)
    restarts = ", ".join("{} at {:.0f} min".format(x["how"], x["t"] / 60) for x in out["restarts"]) or "none"
    lines = [f"# Soak run: {args.minutes} minutes, {args.clients} callers, a worker restart every {args.restart_minutes} min",
             "", f"requests: {len(reqs)} ({len(reqs) / (args.minutes * 60):.1f}/s); lost (meant to succeed, did not): "
             f"{len(lost)}; wrong answers: {len(wrong)}; worker restarts: {restarts}", "",
             "| kind | status | count |", "|---|---|---:|"]
    lines += [f"| {k} | {c} | {n} |" for (k, c), n in sorted(by_code.items())]
    lines += ["", "| minute | requests | p50 ms | p95 ms | p99 ms | " + " | ".join(f"{k} RSS MiB" for k in leaks) + " |",
              "|---:|---:|---:|---:|---:|" + "---:|" * len(leaks)]
    lines += [f"| {r['minute']} | {r['requests']} | {r['p50_ms']} | {r['p95_ms']} | {r['p99_ms']} | "
              + " | ".join(str(r["rss_mib"].get(k)) for k in leaks) + " |" for r in rows]
    lines += ["", f"RSS after the {args.warmup_minutes}-minute warm-up (min / max of per-minute medians, growth):"]
    lines += [f"- {k}: {lo:.0f} / {hi:.0f} MiB, {100 * g:.1f}% ({'flat' if g <= 0.10 else 'GROWS'})"
              for k, (lo, hi, g) in leaks.items()]
    lines += trend_lines(rows, args.warmup_minutes)
    plot(rows, out, results / "soak.png")
    return "\n".join(lines) + "\n"


def trend_lines(rows: list[dict], warmup_minutes: float) -> list[str]:
    """The RSS trend after the warm-up: a least-squares line through the per-minute medians of each
    long-lived process, as its change over the period (a leak climbs; a bounded cache only wobbles)."""
    out = ["", "RSS trend after the warm-up (least-squares line through the per-minute medians; its change over the period):"]
    for name in ("front end", "redis", "steady worker"):
        points = [(r["minute"], r["rss_mib"][name]) for r in rows
                  if r["minute"] >= warmup_minutes and r["rss_mib"].get(name)]
        if len(points) < 3:
            continue
        n = len(points)
        mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
        slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
        change = slope * (points[-1][0] - points[0][0])
        out.append(f"- {name}: {slope * 60:+.1f} MiB/hour, {change:+.1f} MiB = {100 * change / my:+.1f}% of its mean "
                   f"{my:.0f} MiB ({'flat' if abs(change) <= 0.10 * my else 'GROWS'})")
    return out


def _median(values: list) -> float | None:
    values = sorted(v for v in values if v)
    return round(values[len(values) // 2], 1) if values else None


def plot(rows: list[dict], out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lat, mem) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for q in ("p50_ms", "p95_ms", "p99_ms"):
        lat.plot([r["minute"] for r in rows], [r[q] for r in rows], label=q.replace("_ms", ""))
    lat.set_ylabel("latency (ms), answered requests")
    lat.set_yscale("log")
    lat.legend(fontsize=8)
    names = [k for k in (out["rss"][0] if out["rss"] else {}) if k != "t"]
    for name in names:
        mem.plot([x["t"] / 60 for x in out["rss"]], [x[name] for x in out["rss"]], label=name)
    for x in out["restarts"]:
        mem.axvline(x["t"] / 60, color="grey", alpha=0.3, linestyle=":" if x["how"] == "SIGTERM" else "-")
    mem.set_ylabel("RSS (MiB)")
    mem.set_xlabel("minutes (grey: worker restarts; solid = SIGKILL)")
    mem.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--restart-minutes", type=float, default=4)
    parser.add_argument("--warmup-minutes", type=float, default=10)
    parser.add_argument("--results", default="results/soak")
    parser.add_argument("--trend-of", metavar="WINDOWS_JSON", help="only print the RSS trend of an earlier run's windows.json")
    args = parser.parse_args()
    if args.trend_of:
        print("\n".join(trend_lines(json.loads(Path(args.trend_of).read_text()), args.warmup_minutes)))
        return 0
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    traffic = Traffic(Engine())
    out: dict = {"requests": [], "rss": [], "restarts": []}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(Path(tmp))
        try:
            cluster.wait_ready()
            asyncio.run(drive(args, cluster, traffic, out))
        finally:
            cluster.stop()
            cluster.keep_logs(results / "logs")
    summary = summarise(args, out, results)
    (results / "summary.md").write_text(summary)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
