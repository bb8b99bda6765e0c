"""`make bench`: documents scoped to API keys leave no timing oracle.

1. In process, both cache tiers (the shared one on a real redis-server): Bob probing the id Alice was
   given against Bob probing ids never issued, interleaved at random; their medians, p95s and the
   rank-sum test's p-value. Beside it, the same test between two paths that do differ (an unknown
   id with and without the Redis tier: one round trip), to show what the probes can tell apart.
2. Over HTTP (`ilre serve`'s in-process queue on loopback, keys on): the same two kinds of probe.
3. The text Alice sent, sent again by Bob (computed afresh: nothing is shared under the hood),
   against a text nobody sent and against Alice sending it again (a cache hit).
4. A context that grows Alice's text, sent by keys that never sent anything (no prefix of theirs is held),
   against one that grows a text nobody sent, interleaved at random (--grown probes each); beside it,
   Alice growing her own text (her prefix is taken on), to show what resuming would give away.
Usage: bench/scope_bench.py [--probes 1000] [--grown 20] [--tokens 2048] [--output results/bench/scope.txt]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ilre.contract.messages import CompressRequest, NotFoundError  # noqa: E402
from ilre.engine.documents import DocumentCache  # noqa: E402
from ilre.engine.engine import Engine  # noqa: E402
from ilre.evaluation.report.intervals import rank_sum_test  # noqa: E402
from ilre.evaluation.tasks.haystack import shakespeare_text  # noqa: E402
from ilre.service.common.config import ServiceConfig  # noqa: E402
from ilre.service.common.keys import ApiKeys  # noqa: E402
from ilre.service.documents.redis_tier import RedisDocuments  # noqa: E402
from ilre.service.server import ServiceThread  # noqa: E402
from tests.service.conftest import RedisServer  # noqa: E402

QUERY = " Who speaks first? Answer:"
ALICE, BOB = "sk-bench-alice-0f3c9a", "sk-bench-bob-7d21e4"


def interleaved(kinds: dict[str, Callable[[], None]], probes: int, seed: int = 3) -> dict[str, list[float]]:
    """Seconds per call of each kind, `probes` each, in one random order."""
    order = [kind for kind in kinds for _ in range(probes)]
    random.Random(seed).shuffle(order)
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for kind in order:
        start = time.perf_counter()
        kinds[kind]()
        times[kind].append(time.perf_counter() - start)
    return times


def compare(label: str, times: dict[str, list[float]]) -> str:
    """One line: each kind's median and p95 (ms), and the rank-sum p-value between the two."""
    (a, ta), (b, tb) = times.items()
    cells = []
    for kind, values in ((a, ta), (b, tb)):
        ordered = sorted(values)
        cells.append(f"{kind} median {1e3 * statistics.median(ordered):.3f} ms, p95 "
                     f"{1e3 * ordered[int(0.95 * (len(ordered) - 1))]:.3f} ms")
    return f"{label:<44}{'; '.join(cells)}; rank-sum p = {rank_sum_test(ta, tb):.3g}"


def missing(engine: Engine, next_id: Callable[[], str], scope: str) -> Callable[[], None]:
    def probe() -> None:
        try:
            engine.compress(CompressRequest(document_id=next_id(), query=QUERY, budget=64), scope)
        except NotFoundError:
            return
        raise AssertionError("a probe found a document")
    return probe


def ids_of(probes: int, doc: str | None = None, seed: int = 5) -> Callable[[], str]:
    """The next id to probe: `doc` every time, or ids never issued (drawn before any timing, so that
    both kinds of probe spend the same outside the service)."""
    rng = random.Random(seed)
    ids = iter([doc or f"{rng.getrandbits(128):032x}" for _ in range(2 * probes)])
    return lambda: next(ids)


def in_process(engine: Engine, text: str, probes: int, redis_url: str) -> list[str]:
    store = RedisDocuments(redis_url, "bench-scope", 256 << 20, 600)
    try:
        engine.documents = DocumentCache(1 << 30, store)
        doc = engine.compress(CompressRequest(context=text, query=QUERY, budget=64), "key:alice").document_id
        both = interleaved({"cross-key": missing(engine, ids_of(probes, doc), "key:bob"),
                            "unknown": missing(engine, ids_of(probes), "key:bob")}, probes)
        local = DocumentCache(1 << 30)
        shared = engine.documents
        unknown = ids_of(probes, seed=6)

        def tier(cache: DocumentCache) -> Callable[[], None]:
            def probe() -> None:
                engine.documents = cache
                missing(engine, unknown, "key:bob")()
            return probe
        tiers = interleaved({"process only": tier(local), "process+Redis": tier(shared)}, probes)
        engine.documents = shared
    finally:
        store.close()
    return [compare("in process, both tiers", both), compare("(power) unknown id, one tier vs two", tiers)]


def over_http(engine: Engine, text: str, probes: int) -> str:
    config = ServiceConfig(grpc_port=0, http_port=0, max_wait_ms=0, api_keys=ApiKeys([ALICE, BOB]))
    engine.documents = DocumentCache(1 << 30)
    with ServiceThread(config, engine) as svc, httpx.Client(base_url=f"http://127.0.0.1:{svc.http_port}",
                                                             timeout=120) as http:
        doc = http.post("/v1/compress", json={"context": text, "query": QUERY, "budget": 64},
                        headers={"authorization": f"Bearer {ALICE}"}).json()["document_id"]

        def probe(next_id: Callable[[], str]) -> Callable[[], None]:
            def call() -> None:
                reply = http.post("/v1/compress", json={"document_id": next_id(), "query": QUERY},
                                  headers={"authorization": f"Bearer {BOB}"})
                assert reply.status_code == 404, reply.text
            return call
        times = interleaved({"cross-key": probe(ids_of(probes, doc)), "unknown": probe(ids_of(probes, seed=9))}, probes)
    return compare("over HTTP (in-process queue)", times)


def same_text(engine: Engine, text: str, other: str) -> str:
    engine.documents = DocumentCache(1 << 30)
    seconds = {}
    for label, body, scope in (("Alice sends it", text, "key:alice"), ("Alice again", text, "key:alice"),
                               ("Bob sends Alice's text", text, "key:bob"), ("Bob sends a new text", other, "key:bob")):
        start = time.perf_counter()
        engine.compress(CompressRequest(context=body, query=QUERY, budget=64), scope)
        seconds[label] = time.perf_counter() - start
    return "one text, two keys: " + ", ".join(f"{label} {1e3 * s:.0f} ms" for label, s in seconds.items())


def grown(engine: Engine, ids: list[int], tokens: int, probes: int) -> list[str]:
    """Alice's text + a new tail, sent by a new key each time, vs a new text + a new tail (both resume nothing)."""
    engine.documents = DocumentCache(1 << 30)
    alice = ids[:tokens]
    engine.compress(CompressRequest(context_ids=alice, query=QUERY, budget=64), "key:alice")
    tails = iter(ids[tokens * 3 + 300 * n: tokens * 3 + 300 * (n + 1)] for n in range(3 * probes))
    news = iter(ids[tokens * 3 + 900 * probes + tokens * n:][:tokens] for n in range(probes))
    keys = iter(f"key:new-{n}" for n in range(3 * probes))

    def send(prefix: Callable[[], list[int]], scope: Callable[[], str], resumed: bool) -> Callable[[], None]:
        def call() -> None:
            result = engine.compress(CompressRequest(context_ids=prefix() + next(tails), query=QUERY, budget=64),
                                     scope())
            assert (result.resumed_tokens > 0) == resumed, result.resumed_tokens
        return call
    across = interleaved({"Alice's text grown": send(lambda: alice, lambda: next(keys), False),
                          "a new text grown": send(lambda: next(news), lambda: next(keys), False)}, probes)
    own = interleaved({"Alice's text grown": send(lambda: alice, lambda: next(keys), False),
                       "by Alice": send(lambda: alice, lambda: "key:alice", True)}, probes // 2)
    return [compare("grown text, keys that sent nothing", across), compare("(power) grown text, a new key vs Alice", own)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--probes", type=int, default=1000, help="per kind")
    parser.add_argument("--grown", type=int, default=20, help="probes per kind of grown text")
    parser.add_argument("--tokens", type=int, default=2048, help="tokens of the stored document")
    parser.add_argument("--output", default="results/bench/scope.txt")
    args = parser.parse_args()
    engine = Engine()
    ids = engine.tokenizer(shakespeare_text(), add_special_tokens=False).input_ids
    text, other = (engine.tokenizer.decode(ids[start:start + args.tokens]) for start in (0, args.tokens))
    lines = [f"document scope: {args.probes} probes per kind, a {args.tokens}-token document, {engine.model_name}"]
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(Path(tmp))
        redis.start()
        try:
            lines += in_process(engine, text, args.probes, redis.url)
        finally:
            redis.stop()
    lines.append(over_http(engine, text, args.probes // 2))
    lines.append(same_text(engine, text, other))
    lines += grown(engine, ids, args.tokens, args.grown)
    report = "\n".join(lines)
    print(report)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
