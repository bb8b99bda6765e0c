"""`make soak-partitions`: --minutes of traffic on the queue across seven hosts (tests/hosts/site.py: three Redis
hosts with a sentinel each, two workers, a front end, a client, each in a network namespace) with a network fault every
1-3 minutes (every kind in turn, each round in a random order), each healed before the next:
  worker cut      a worker cut from every Redis host for 30 s (its request reclaimed by the other past claim_idle)
  front end cut   the front end cut from Redis for 20 s (its callers told within --redis-retry + 5 s)
  master split    the master cut from its replicas and sentinels for 40 s (a failover; it rejoins as a replica)
  slow links      200 ms of delay and 5% loss on both workers' links to Redis for 60 s
  worker frozen   a worker host stopped (SIGSTOP) past claim_idle (FROZEN_S, 28 s)
The servers run with their defaults (the document cache, its shared tier on Redis and deepening on). Callers
(--callers, from the client host, no pause) send requests of ~2,500 tokens drawn from a pool of 12 contexts, each with
its own planted fact, each request with an id of its own (the body's `id`, kept on a refusal's retry). Counted at the
client, per request: answers that are its own (the reply's id, its fact kept, no other context's fact) (ok; of them,
equal to the idle service's first answer: the rest came from a cached or deepened encoding) or not (wrong), refusals
before acceptance (503, retried by the caller under the same id), clear errors after it (503 while waiting, 504),
replies never received (lost). Results left unread on Redis at the end are read by their id: a second delivery of a
request its caller had answered (duplicated: e.g. run again after its acknowledgement was lost with a failed-over
master's writes), a late answer of one whose caller got a clear error, or neither (unattributable). Each fault's
recovery time (its heal to the first answer of a request sent after it); the RSS of the front end and the workers
over time (first and last 5 minutes' medians); the workers' retries, reclaims, take-backs and stale results dropped.
Writes results/bench/soak-partitions/{summary.md,faults.jsonl,samples.jsonl}.

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
    """Callers sending requests until stopped; every reply classified, per request id."""

    def __init__(self, site: Site, callers: int, seed: int):
        self.site, self.rng = site, random.Random(seed)
        self.counts: Counter[str] = Counter()
        self.oks: list[tuple[float, float]] = []  # (sent, answered) of each ok answer
        self.outcome: dict[str, int] = {}  # request id -> the HTTP status its caller got last (200: answered)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.futures = [site.cluster.pool("client", callers + 2).submit(self._caller, k) for k in range(callers)]

    def _caller(self, k: int) -> None:
        rng = random.Random(k * 7919 + self.rng.random())
        n = 0
        while not self.stop.is_set():
            i, n = rng.randrange(POOL), n + 1
            rid = f"c{k}-{n}"
            while self._ask(i, rid) == "refused" and not self.stop.is_set():
                time.sleep(1.0)  # the same request again, under its id

    def _ask(self, i: int, rid: str) -> str:
        sent = time.monotonic()
        try:
            response = self.site.compress(i, timeout_s=90, request_id=rid)
        except Exception as exc:  # no reply at all within the client's 120 s
            self._count("lost", f"{rid}: {type(exc).__name__}")
            return "lost"
        with self.lock:
            self.outcome[rid] = response.status_code
        if response.status_code == 200:
            problem = own_answer(i, rid, response.json())
            if problem:
                self._count("wrong", f"{rid}: {problem}")
                return "wrong"
            with self.lock:
                self.counts["ok"] += 1
                self.counts["ok, equal to the idle answer"] += same_as_idle(self.site, i, response)
                self.oks.append((sent, time.monotonic()))
            return "ok"
        if response.status_code == 503 and refused(response.text):
            self._count("refused before acceptance (retried)")
            return "refused"
        if response.status_code in (503, 504):
            self._count(f"clear error after acceptance ({response.status_code})")
            return "error"
        self._count(f"other {response.status_code}", response.text[:200])
        return "other"

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


def own_answer(i: int, rid: str, reply: dict) -> str:
    """What is wrong with `reply` as the answer of request `rid` about pool context i ('' when nothing): its id,
    its planted fact kept, no other context's fact."""
    text = reply.get("compressed_context") or (reply.get("results") or [{}])[0].get("compressed_context") or ""
    if reply.get("id") != rid:
        return f"the reply's id is {reply.get('id')!r}"
    if f"is {7100 + i}" not in text:
        return f"fact {i} not kept"
    others = [j for j in range(POOL) if j != i and f"is {7100 + j}" in text]
    return f"facts of other contexts: {others}" if others else ""


def same_as_idle(site: Site, i: int, response) -> bool:
    try:
        site.same_as_idle(i, response)
    except AssertionError:
        return False
    return True


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


def leftovers(site: Site, traffic: Traffic) -> Counter[str]:
    """Results left unread on Redis, read by their request id against what each caller got."""
    left = site.redis(lambda r: [r.lrange(k, 0, -1) for k in r.keys(f"{PREFIX}:result:*")])
    kinds: Counter[str] = Counter()
    for raw in (raw for results in left for raw in results):
        reply = json.loads(raw).get("ok")
        rid = reply.get("id") if isinstance(reply, dict) else None
        status = traffic.outcome.get(rid) if isinstance(rid, str) else None
        if status == 200:
            kinds["duplicated: a second delivery of an answered request"] += 1
        elif status is not None:
            kinds[f"a late answer of a request whose caller got {status}"] += 1
        else:
            kinds["unattributable"] += 1
            print(f"  unattributable result left unread: {raw[:300]}", flush=True)
    return kinds


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
    with started_site(POOL) as site:  # the servers' defaults
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
        left = leftovers(site, traffic)
        metrics = {name: {host: site.metric(host, f"ilre_{name}_total") for host in (*WORKERS, "fe")}
                   for name in ("redis_retries", "reclaimed", "own_pending_taken", "stale_results_dropped",
                                "doc_cache_shared_skipped")}
    (OUT / "faults.jsonl").write_text("".join(json.dumps(f) + "\n" for f in faults))
    (OUT / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    counts = traffic.counts
    lines = [f"# soak-partitions: {args.minutes:g} minutes, {args.callers} callers, {len(faults)} faults\n",
             "| outcome | requests |", "|---|---|", *(f"| {k} | {v} |" for k, v in sorted(counts.items())),
             *(f"| results left unread: {k} | {v} |" for k, v in sorted(left.items())), "",
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
    return 0 if not counts["lost"] and not counts["wrong"] and not left["unattributable"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
