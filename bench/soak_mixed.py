"""`make soak-mixed`: an hour of several API keys' traffic, one of them flooding, under faults (real processes).

The cluster of bench/soak.py (redis-server with AOF, `ilre serve`, two `ilre worker`s; deepening on, the
default; the default document caches, 1 GiB in process and 2 GiB on Redis, shares of 1/8 each) with API keys on:
  flood     two callers with no pause: documents never sent before (records, code, CSV, logs, needles; 1-4K
            tokens) and gateway calls of them, several times the caches' capacity within the hour
  quiet-a   one caller every 1-4 s: three documents of its own (JSON lines 2K, Python 4K, prose 8K), asked again
  quiet-b   by text and by document_id, and through the gateway (compress, then retrieve each hash); quiet-b
            also asks a 32K-token document now and then (CSV 2K, logs 3K, needle 32K)
Faults on a schedule: a worker restart every --restart-minutes (SIGTERM; every third SIGKILL), a Redis restart
(SIGTERM: AOF written, same port) every --redis-minutes; with --sentinel Redis is a Sentinel group (a master, two
replicas, three sentinels) and that fault is a failover instead (the master killed, SIGKILL and SIGTERM in turn, a
replica promoted, the old master back as a replica). Requests the front end did not accept while Redis had no
master (UNAVAILABLE, HTTP 503) are retried by the callers, as the failover test's callers do, and counted.

Checked: every quiet request is answered (0 lost) with the answer the same request gets on an idle engine,
the first query's (the cascade) or a deepened document's (both computed in this process beforehand, each
deterministic); a retrieve gives the message back byte for byte; a flood answer meets its budget. The quiet
keys' cache hit rate (a repeated document whose encoded state the shared tier held when it was asked again) is
compared with a run without the flood (--no-flood, saved as baseline.json); the long-lived processes' RSS over
the last 30 minutes (max over min of per-minute medians of a sample every 2 s) and Redis's used memory against its cap (also as Redis
counts it against maxmemory: less the replicas' output buffers and the AOF buffer, which a failover's resync fills).
Writes results/bench/soak-mixed/{summary.md,windows.json,requests.jsonl,samples.jsonl,logs/}; baseline.{json,md} with --no-flood.
Usage: bench/soak_mixed.py [--minutes 60] [--no-flood] [--sentinel] [--restart-minutes 4] [--redis-minutes 15]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mixed_bench import SUITE, sample  # noqa: E402
from growing_bench import full_depth_options  # noqa: E402
from soak import Cluster, _median, rss_mib  # noqa: E402

from ilre.contract.messages import CompressRequest  # noqa: E402
from ilre.engine.document_names import DocumentNames  # noqa: E402
from ilre.engine.documents import DocumentCache  # noqa: E402
from ilre.engine.engine import Engine  # noqa: E402
from ilre.service.client import AsyncClient, ClientError  # noqa: E402

KEYS = {"flood": "sk-soak-flood-5b1e07c2", "quiet-a": "sk-soak-quiet-a-94d0f3", "quiet-b": "sk-soak-quiet-b-2ac8e6"}
QUIET_DOCUMENTS = {"quiet-a": (("JSON lines", 2048, 1), ("Python source", 4096, 2), ("prose question", 8192, 3)),
                   "quiet-b": (("CSV with header", 2048, 4), ("access logs", 3072, 5), ("single needle", 32768, 6))}
LONG = 32768  # a quiet-b document asked one time in ten
BUDGET, GATEWAY_BUDGET = 512, 600
SHARED_CAP_MIB = 2048
CACHES = ("--doc-cache-mb", "1024", "--doc-cache-shared-mb", str(SHARED_CAP_MIB))  # the defaults
WINDOW_S = 60
SAMPLE_S = 2  # how often RSS and Redis's memory are sampled
RETRY_S = 120  # how long a caller retries a request the front end did not accept


@dataclass
class Document:
    """A quiet key's document: its IDs, query, text (the gateway's tool message), the answers an idle engine
    gives (the cascade's first query, a deepened document's), and its cold prefill in ms."""

    context: list[int]
    query: list[int]
    text: str
    answers: tuple[list[int], list[int]]
    cold_prefill_ms: float


def idle_answers(engine: Engine, context: list[int], query: list[int]) -> tuple[list[int], list[int], float]:
    """(the cascade's kept indices, a deepened document's, the cold prefill ms) on this process's idle engine."""
    engine.documents = DocumentCache(0)
    first = engine.compress(CompressRequest(context_ids=context, query_ids=query, budget=BUDGET))
    blended = full_depth_options(engine.profile)
    deep = engine.compress(CompressRequest(context_ids=context, query_ids=query, budget=BUDGET, strategy="ilre",
                                           strategy_options=blended))
    return first.kept_indices, deep.kept_indices, first.timings_ms["prefill"]


def quiet_documents(engine: Engine) -> dict[str, list[Document]]:
    out = {}
    for key, specs in QUIET_DOCUMENTS.items():
        out[key] = []
        for kind, length, index in specs:
            context, query, _ = sample(engine.tokenizer, kind, length, index)
            first, deep, cold = idle_answers(engine, context, query)
            out[key].append(Document(context, query, engine.tokenizer.decode(context), (first, deep), cold))
            print(f"{key}: {kind} {len(context)} tokens, cold prefill {cold:.0f} ms", flush=True)
    return out


class Traffic:
    def __init__(self, engine: Engine, cluster: Cluster, out: dict):
        self.tokenizer, self.cluster, self.out = engine.tokenizer, cluster, out
        self.documents = quiet_documents(engine)
        self.ids: dict[tuple[str, int], str] = {}  # (key, document) -> its document_id
        self.redis = cluster.redis_client()

    def held(self, key: str, document_id: str) -> bool | None:
        """Whether the shared tier holds an encoded state of `key`'s document right now (its slot from the service's
        document secret on Redis, as a worker computes it); None while Redis cannot say (restarting)."""
        try:
            secret = self.redis.get("ilre:document-secret")
            if secret is None:
                return None
            slot = DocumentNames(secret).slot(f"key:{key}", document_id)
            return any(True for _ in self.redis.hscan_iter("ilre:docs:bytes", match=f"ilre:doc:{slot}:state:*"))
        except redis.RedisError:
            return None

    def record(self, key: str, kind: str, code: str, right: bool, sent: float, hit: bool | None = None) -> None:
        self.out["requests"].append({"t": sent - self.out["start"], "key": key, "kind": kind, "code": code,
                                     "right": right, "hit": hit, "seconds": time.monotonic() - sent})

    async def quiet(self, key: str, grpc: AsyncClient, http: httpx.AsyncClient, rng: random.Random) -> None:
        docs = self.documents[key]
        long = len(docs[-1].context) >= LONG - 64
        n = len(docs) - 1 if long and rng.random() < 0.1 else rng.randrange(len(docs) - long)
        doc, sent = docs[n], time.monotonic()
        way = rng.choice(("context", "id", "gateway")) if (key, n) in self.ids else "context"
        try:
            if way == "gateway":
                code, right = await self.gateway(http, key, doc)
                return self.record(key, "gateway", code, right, sent)
            hit = await asyncio.to_thread(self.held, key, self.ids[key, n]) if (key, n) in self.ids else None
            if way == "id":
                result = await self.retried(lambda: grpc.compress(None, doc.query, document_id=self.ids[key, n],
                                                                  budget=BUDGET))
            else:
                result = await self.retried(lambda: grpc.compress(doc.context, doc.query, budget=BUDGET))
            self.ids[key, n] = result.document_id
            self.record(key, way, "OK", result.kept_indices in doc.answers, sent, hit)
        except ClientError as exc:
            self.record(key, way, exc.code, False, sent)

    async def retried(self, call: Callable[[], Awaitable]):
        """`call()`, again while the front end refuses it as not accepted (UNAVAILABLE while Redis has no master),
        as a caller would, for up to RETRY_S; counted in out["retried"]."""
        give_up = time.monotonic() + RETRY_S
        while True:
            try:
                return await call()
            except ClientError as exc:
                if exc.code != "UNAVAILABLE" or "accepted request waits" in exc.message or time.monotonic() > give_up:
                    raise
            self.out["retried"] += 1
            await asyncio.sleep(0.5)

    async def http_retried(self, http: httpx.AsyncClient, method: str, path: str, **kwargs) -> httpx.Response:
        """An HTTP call, again on 503 (not accepted: no master, or no replica acknowledged it in time) as `retried`
        does."""
        give_up = time.monotonic() + RETRY_S
        while True:
            reply = await http.request(method, path, **kwargs)
            if reply.status_code != 503 or time.monotonic() > give_up:
                return reply
            self.out["retried"] += 1
            await asyncio.sleep(0.5)

    async def gateway(self, http: httpx.AsyncClient, key: str, doc: Document) -> tuple[str, bool]:
        """Compress a chat holding the document as a tool result, then retrieve every hash it names: the
        originals must come back byte for byte."""
        question = self.tokenizer.decode(doc.query)
        messages = [{"role": "tool", "tool_call_id": "c1", "content": doc.text}, {"role": "user", "content": question}]
        headers = {"authorization": f"Bearer {KEYS[key]}"}
        reply = await self.http_retried(http, "POST", "/v1/compress", json={"messages": messages, "budget": GATEWAY_BUDGET},
                                        headers=headers)
        if reply.status_code != 200:
            return str(reply.status_code), False
        hashes = reply.json().get("ccr_hashes") or []
        for hash_ in hashes:
            back = await self.http_retried(http, "GET", f"/v1/retrieve/{hash_}", headers=headers)
            if back.status_code != 200 or back.json().get("original_content") != doc.text:
                return f"retrieve {back.status_code}", False
        return "OK", bool(hashes)

    async def flood(self, grpc: AsyncClient, http: httpx.AsyncClient, rng: random.Random) -> None:
        kind = rng.choice(list(SUITE))
        context, query, _ = sample(self.tokenizer, kind, rng.choice((1024, 2048, 4096)), rng.randrange(1 << 30))
        sent = time.monotonic()
        try:
            if rng.random() < 0.2:
                messages = [{"role": "tool", "tool_call_id": "c1", "content": self.tokenizer.decode(context)},
                            {"role": "user", "content": self.tokenizer.decode(query)}]
                reply = await self.http_retried(http, "POST", "/v1/compress", json={"messages": messages, "budget": GATEWAY_BUDGET},
                                                headers={"authorization": f"Bearer {KEYS['flood']}"})
                return self.record("flood", "gateway", "OK" if reply.status_code == 200 else str(reply.status_code),
                                   reply.status_code == 200, sent)
            result = await self.retried(lambda: grpc.compress(context, query, budget=BUDGET))
            kept = result.kept_indices
            self.record("flood", "context", "OK", result.compressed_tokens == min(BUDGET, len(context))
                        and kept == sorted(set(kept)), sent)
        except ClientError as exc:
            self.record("flood", "context", exc.code, False, sent)


async def drive(args, cluster: Cluster, traffic: Traffic, out: dict) -> None:
    start = out["start"]
    end = start + args.minutes * 60
    probe = cluster.redis_client()

    async def caller(key: str, n: int) -> None:
        rng = random.Random(f"{key}-{n}")
        async with AsyncClient(f"127.0.0.1:{cluster.grpc_port}", timeout=600, api_key=KEYS[key]) as grpc, \
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{cluster.http_port}", timeout=600) as http:
            while time.monotonic() < end:
                if key == "flood":
                    await traffic.flood(grpc, http, rng)
                else:
                    await traffic.quiet(key, grpc, http, rng)
                    await asyncio.sleep(rng.uniform(1.0, 4.0))

    async def sampler() -> None:
        """Every SAMPLE_S: the processes' RSS and Redis's memory (a minute's median then rests on 30 samples, not
        on the few a request's working set can sway)."""
        while time.monotonic() < end:
            now = time.monotonic()
            try:
                memory = await asyncio.to_thread(probe.info, "memory")
                used = memory["used_memory"] / 2**20
                counted = used - memory.get("mem_not_counted_for_evict", 0) / 2**20
            except redis.RedisError:
                used = counted = None
            out["rss"].append({"t": now - start, "redis used": used, "redis counted": counted,
                               **{name: rss_mib(pid) for name, pid in cluster.pids().items()}})
            await asyncio.sleep(SAMPLE_S)

    async def faults() -> None:
        next_restart, next_redis = start + args.restart_minutes * 60, start + args.redis_minutes * 60
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_restart:
                out["faults"].append({"t": now - start, "how": await asyncio.to_thread(cluster.restart_worker)})
                next_restart += args.restart_minutes * 60
            if now >= next_redis:
                out["faults"].append({"t": now - start, "how": await asyncio.to_thread(cluster.restart_redis)})
                next_redis += args.redis_minutes * 60
            await asyncio.sleep(1)

    callers = [caller(key, 0) for key in QUIET_DOCUMENTS] + ([] if args.no_flood else [caller("flood", n) for n in range(2)])
    await asyncio.gather(sampler(), faults(), *callers)


def hit_rates(requests: list[dict]) -> dict[str, float]:
    rates = {}
    for key in QUIET_DOCUMENTS:
        hits = [r["hit"] for r in requests if r["key"] == key and r["hit"] is not None]
        rates[key] = round(sum(hits) / len(hits), 3) if hits else None
    return rates


def summarise(args, out: dict, results: Path) -> str:
    reqs = out["requests"]
    windows = defaultdict(list)
    for x in out["rss"]:
        windows[int(x["t"] // WINDOW_S)].append(x)
    names = sorted({k for x in out["rss"] for k in x} - {"t"})
    rows = [{"minute": w, "rss_mib": {k: _median([x.get(k) for x in windows[w]]) for k in names}} for w in sorted(windows)]
    (results / "windows.json").write_text(json.dumps(rows, indent=1) + "\n")
    quiet = [r for r in reqs if r["key"] != "flood"]
    lost = [r for r in quiet if r["code"] != "OK"]
    wrong = [r for r in reqs if r["code"] == "OK" and not r["right"]]
    rates = hit_rates(reqs)
    redis_fault = "a Sentinel failover" if args.sentinel else "a Redis restart"
    lines = [f"# Mixed soak: {args.minutes} minutes, {'no flood' if args.no_flood else 'one key flooding'}, "
             f"a worker restart every {args.restart_minutes} min, {redis_fault} every {args.redis_minutes} min", "",
             f"`{out['command']}`", "",
             f"requests: {len(reqs)} ({len(quiet)} quiet); quiet lost: {len(lost)}; wrong answers: {len(wrong)}; "
             f"not accepted and retried by the caller: {out['retried']}; faults: " + (", ".join(f"{f['how']} at {f['t'] / 60:.0f} min" for f in out["faults"]) or "none"), "",
             "| key | way | status | count |", "|---|---|---|---:|"]
    lines += [f"| {k} | {w} | {c} | {n} |" for (k, w, c), n in sorted(Counter((r["key"], r["kind"], r["code"])
                                                                              for r in reqs).items())]
    lines += ["", "quiet keys' cache hit rate (repeated documents): "
              + ", ".join(f"{k} {v}" for k, v in rates.items())]
    baseline = results / "baseline.json"
    if not args.no_flood and baseline.is_file():
        before = json.loads(baseline.read_text())["hit_rates"]
        lines.append("without the flood (baseline.json): " + ", ".join(f"{k} {v}" for k, v in before.items())
                     + "; within 10%: " + str(all(rates[k] is not None and before.get(k) is not None
                                                  and rates[k] >= 0.9 * before[k] for k in rates)))
    last = [row for row in rows if row["minute"] >= args.minutes - 30]
    lines += ["", f"RSS over the last 30 minutes (min / max of per-minute medians, a sample every {SAMPLE_S} s; "
              "then the medians of its first and second 15 minutes):"]
    for name in ("front end", "steady worker", *(() if args.sentinel else ("redis",))):
        values = [row["rss_mib"].get(name) for row in last if row["rss_mib"].get(name)]
        if values:
            growth = max(values) / min(values) - 1
            halves = [_median([v for row, v in zip(last, values) if (row["minute"] >= args.minutes - 15) == late])
                      for late in (False, True)]
            lines.append(f"- {name}: {min(values):.0f} / {max(values):.0f} MiB, {100 * growth:.1f}% "
                         f"({'flat' if growth <= 0.05 else 'GROWS'}); halves {halves[0]:.0f} / {halves[1]:.0f} MiB")
    for field, what in (("redis used", "Redis used memory"),
                        ("redis counted", "Redis used memory as Redis counts it against maxmemory (less the "
                                          "replicas' output buffers and the AOF buffer, which a failover's resync fills)")):
        values = [x[field] for x in out["rss"] if x.get(field)]
        if values:
            medians = [row["rss_mib"][field] for row in rows if row["rss_mib"].get(field)]
            lines.append(f"- {what}: max {max(values):.0f} MiB (of per-minute medians {max(medians):.0f}) against a "
                         f"{SHARED_CAP_MIB} MiB cap ({'within' if max(values) <= 1.1 * SHARED_CAP_MIB else 'OVER'} "
                         "the cap + 10%)")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--no-flood", action="store_true", help="the quiet keys alone (writes baseline.json)")
    parser.add_argument("--restart-minutes", type=float, default=4)
    parser.add_argument("--redis-minutes", type=float, default=15)
    parser.add_argument("--sentinel", action="store_true",
                        help="Redis as a Sentinel group; its faults are failovers (the master killed, a replica promoted)")
    parser.add_argument("--results", default="results/bench/soak-mixed")
    args = parser.parse_args()
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    engine = Engine()
    out: dict = {"requests": [], "rss": [], "faults": [], "retried": 0, "command": " ".join(sys.argv)}
    with tempfile.TemporaryDirectory() as tmp:
        keys = Path(tmp) / "keys"
        keys.write_text("".join(f"{secret} name={name}\n" for name, secret in KEYS.items()))
        cluster = Cluster(Path(tmp), front=("--api-keys-file", str(keys)), worker=CACHES, sentinel=args.sentinel)
        try:
            traffic = Traffic(engine, cluster, out)
            cluster.wait_ready()
            out["start"] = time.monotonic()
            asyncio.run(drive(args, cluster, traffic, out))
        finally:
            cluster.stop()
            cluster.keep_logs(results / "logs")
    with (results / "requests.jsonl").open("w") as f:
        f.writelines(json.dumps(r) + "\n" for r in out["requests"])
    with (results / "samples.jsonl").open("w") as f:
        f.writelines(json.dumps(x) + "\n" for x in out["rss"])
    summary = summarise(args, out, results)
    if args.no_flood:
        (results / "baseline.json").write_text(json.dumps({"minutes": args.minutes, "hit_rates": hit_rates(out["requests"])}) + "\n")
    (results / ("baseline.md" if args.no_flood else "summary.md")).write_text(summary)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
