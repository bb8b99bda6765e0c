"""`make soak-partitions`: --minutes of traffic on the queue across seven hosts (tests/hosts/site.py: three Redis
hosts with a sentinel each, two workers, a front end, a client, each in a network namespace) with a network fault every
1-3 minutes (every kind in turn, each round in a random order), each healed before the next:
  worker cut      a worker cut from every Redis host for 30 s (its request reclaimed by the other past claim_idle)
  front end cut   the front end cut from Redis for 20 s (its callers told within --redis-retry + 5 s)
  master split    the master cut from its replicas and sentinels for 40 s (a failover; it rejoins as a replica)
  slow links      200 ms of delay and 5% loss on both workers' links to Redis for 60 s
  worker frozen   a worker host stopped (SIGSTOP) past claim_idle (FROZEN_S, 28 s)
Callers (--callers, from the client host, no pause) send requests of ~2,500 tokens drawn from a pool whose answers
were taken on the idle service first. Counted: answers equal to the idle one (ok) or not (wrong), refusals before
acceptance (503, retried by the caller), clear errors after it (503 while waiting, 504), replies never received
(lost); results left unread at the end (a request run again after its acknowledgement was lost with a partitioned
master's writes: equal to an answer already given, or not: duplicated); each fault's recovery time (its heal to the
first answer of a request sent after it); the RSS of the front end and the workers over time (first and last 5
minutes' medians). Writes results/bench/soak-partitions/{summary.md,faults.jsonl,samples.jsonl}.

    .venv/bin/python bench/soak_partitions.py [--minutes 30] [--callers 3] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from soak import rss_mib  # noqa: E402
from tests.hosts.cluster import missing_tools  # noqa: E402
from tests.hosts.site import FROZEN_S, PREFIX, REDIS, WORKERS, Site, started_site  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "results" / "bench" / "soak-partitions"
POOL = 12  # distinct requests, answers taken on the idle service


class Traffic:
    """Callers sending requests until stopped; every reply classified."""

    def __init__(self, site: Site, callers: int, seed: int):
        self.site, self.rng = site, random.Random(seed)
        self.counts: Counter[str] = Counter()
        self.oks: list[tuple[float, float]] = []  # (sent, answered) of each ok answer
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.futures = [site.cluster.pool("client", callers + 2).submit(self._caller, k) for k in range(callers)]

    def _caller(self, k: int) -> None:
        rng = random.Random(k * 7919 + self.rng.random())
        while not self.stop.is_set():
            i = rng.randrange(POOL)
            sent = time.monotonic()
            try:
                response = self.site.compress(i, timeout_s=90)
            except Exception as exc:  # no reply at all within the client's 120 s
                self._count("lost", f"{type(exc).__name__}")
                continue
            if response.status_code == 200:
                try:
                    self.site.same_as_idle(i, response)
                except AssertionError as exc:
                    self._count("wrong", "" if self.counts["wrong"] else str(exc)[:400])
                    continue
                with self.lock:
                    self.counts["ok"] += 1
                    self.oks.append((sent, time.monotonic()))
            elif response.status_code == 503 and refused(response.text):
                self._count("refused before acceptance (retried)")
                time.sleep(1.0)
            elif response.status_code in (503, 504):
                self._count(f"clear error after acceptance ({response.status_code})")
            else:
                self._count(f"other {response.status_code}", response.text[:200])

    def _count(self, what: str, detail: str = "") -> None:
        with self.lock:
            self.counts[what] += 1
        if detail:
            print(f"  {what}: {detail}", flush=True)

    def first_ok_after(self, moment: float, timeout: float = 180) -> float | None:
        """Seconds from `moment` to the first ok answer of a request sent after it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                done = [answered for sent, answered in self.oks if sent >= moment]
            if done:
                return min(done) - moment
            time.sleep(0.2)
        return None

    def finish(self) -> None:
        self.stop.set()
        for future in self.futures:
            future.result()


def refused(message: str) -> bool:
    """A 503 for a request the queue did not accept (a caller retries it), not one it lost track of."""
    return "not accepted" in message or "no worker is registered" in message or (
        "Redis is unreachable" in message and "waits for its result" not in message)


def fault(site: Site, name: str, rng: random.Random) -> float:
    """Inject fault `name`, hold it, heal it; the moment it healed."""
    cluster = site.cluster
    if name == "worker cut":
        worker = rng.choice(WORKERS)
        cluster.cut(worker, *REDIS)
        time.sleep(30)
        cluster.heal(worker, *REDIS)
    elif name == "front end cut":
        cluster.cut("fe", *REDIS)
        time.sleep(20)
        cluster.heal("fe", *REDIS)
    elif name == "master split":
        old = site.group.master()
        rest = [h for h in REDIS if h != old]
        cluster.cut(old, *rest)
        time.sleep(40)
        cluster.heal(old, *rest)
    elif name == "slow links":
        for worker in WORKERS:
            for node in REDIS:
                cluster.delay(worker, node, 200)
                cluster.loss(worker, node, 5)
        time.sleep(60)
        for worker in WORKERS:
            cluster.heal(worker, *REDIS)
    elif name == "worker frozen":
        worker = rng.choice(WORKERS)
        cluster.freeze(worker)
        time.sleep(FROZEN_S)
        cluster.thaw(worker)
    return time.monotonic()


FAULTS = ("worker cut", "front end cut", "master split", "slow links", "worker frozen")


def sample(site: Site) -> dict:
    procs = {"fe": site.front.proc.pid, **{w: site.workers[w].proc.pid for w in WORKERS}}
    return {"t": time.time(), **{name: rss_mib(pid) for name, pid in procs.items()}}


def leftovers(site: Site) -> tuple[int, int]:
    """Results left unread: (runs again of a request already answered, anything else)."""
    given = {site.reference[i].json()["compressed_context"] for i in site.reference}
    left = site.redis(lambda r: [r.lrange(k, 0, -1) for k in r.keys(f"{PREFIX}:result:*")])
    again = other = 0
    for results in left:
        for raw in results:
            ok = json.loads(raw).get("ok") or {}
            text = ok.get("compressed_context") or (ok.get("results") or [{}])[0].get("compressed_context")
            again, other = (again + 1, other) if text in given else (again, other + 1)
    return again, other


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--callers", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if reason := missing_tools():
        raise SystemExit(f"soak-partitions: the hosts cannot be made here: {reason}")
    OUT.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    faults, samples, order = [], [], []
    # every request computed in full, as its idle answer was: no document cache, no deepening (a request asked
    # again would meet its own cached or deepened encoding, a different path with answers of its own)
    with started_site(POOL, "--deepen", "off", "--doc-cache-mb", "0") as site:
        traffic = Traffic(site, args.callers, args.seed)
        start = time.monotonic()
        end = start + args.minutes * 60
        next_sample = 0.0
        while time.monotonic() < end:
            pause = rng.uniform(60, 180)
            until = min(end, time.monotonic() + pause)
            while time.monotonic() < until:
                if time.monotonic() >= next_sample:
                    samples.append(sample(site))
                    next_sample = time.monotonic() + 30
                time.sleep(1)
            if time.monotonic() >= end - 60:
                break
            if not order:  # every kind in turn, each round in a random order
                order = rng.sample(FAULTS, len(FAULTS))
            name = order.pop()
            began = time.monotonic() - start
            healed = fault(site, name, rng)
            recovery = traffic.first_ok_after(healed)
            row = {"fault": name, "at_s": round(began, 1), "recovery_s": None if recovery is None else round(recovery, 1),
                   "counts": dict(traffic.counts)}
            faults.append(row)
            print(json.dumps(row), flush=True)
        traffic.finish()
        samples.append(sample(site))
        again, other = leftovers(site)
        metrics = {name: {host: site.metric(host, f"ilre_{name}_total") for host in (*WORKERS, "fe")}
                   for name in ("redis_retries", "reclaimed", "stale_results_dropped")}
    (OUT / "faults.jsonl").write_text("".join(json.dumps(f) + "\n" for f in faults))
    (OUT / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    counts = traffic.counts
    lines = [f"# soak-partitions: {args.minutes:g} minutes, {args.callers} callers, {len(faults)} faults\n",
             "| outcome | requests |", "|---|---|", *(f"| {k} | {v} |" for k, v in sorted(counts.items())),
             f"| results left unread: runs again of an answered request | {again} |",
             f"| results left unread: duplicated (anything else) | {other} |", "",
             "| fault | at (s) | recovery (s) |", "|---|---|---|",
             *(f"| {f['fault']} | {f['at_s']} | {f['recovery_s']} |" for f in faults), ""]
    window = max(1, min(10, len(samples) // 3))  # 30 s samples: the first and last 5 minutes
    for name in ("fe", *WORKERS):
        values = [s[name] for s in samples if s.get(name)]
        if values:
            lines.append(f"RSS {name}: first {statistics.median(values[:window]):.0f} MiB, "
                         f"last {statistics.median(values[-window:]):.0f} MiB")
    lines.append(f"\nmetrics: {json.dumps(metrics)}")
    (OUT / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if not counts["lost"] and not counts["wrong"] and not other else 1


if __name__ == "__main__":
    raise SystemExit(main())
