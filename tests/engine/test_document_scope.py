"""Cached documents belong to the API key that stored them (or to its share group): the keyed names,
the engine's lookups (another key's id misses exactly like an unknown one, in the same time), and
every path through a real `ilre serve` in front of a real redis-server and two real `ilre worker`
processes: gRPC Compress and CompressQueries, HTTP compress and explain, `ilre compress --server`,
the shared tier, restarts, a rotated secret, logs and metrics."""

from __future__ import annotations

import json
import os
import random
import subprocess
import time

import httpx
import pytest
import torch

from ilre.contract.messages import CompressRequest, NotFoundError
from ilre.engine.document_names import DocumentNames
from ilre.engine.documents import DocumentCache
from ilre.engine.engine import NOT_FOUND_MESSAGE
from ilre.evaluation.report.intervals import rank_sum_test
from ilre.service.client import Client, ClientError
from ilre.service.common.errors import ConfigError
from ilre.service.common.keys import ANONYMOUS, ApiKeys
from ilre.service.documents.redis_tier import RedisDocuments

from tests.service.conftest import ILRE, QUERY, Served, WorkerProcess, context, service_config, wait_for
from tests.shallow import engine_on_shallow_calibration  # noqa: F401 (engine: a flow, on the shallow calibration)


KEYS = {"alice": "sk-alice-5f0c2a9e71", "bob": "sk-bob-88d1e4c03b", "carol": "sk-carol-1a7e90c2d4",
        "dave": "sk-dave-c4b2e17f09"}
KEYS_FILE = "\n".join([f"{KEYS['alice']} name=alice", f"{KEYS['bob']} name=bob rate=1000",
                       f"{KEYS['carol']} name=carol share=team", f"{KEYS['dave']} name=dave share=team"]) + "\n"
PROBES = 150  # per kind, in the timing tests


def test_each_key_has_its_own_scope_and_a_share_group_one_together(tmp_path):
    path = tmp_path / "keys.txt"
    path.write_text(KEYS_FILE)
    keys = ApiKeys.load({}, str(path))
    scopes = {name: keys.identify(f"Bearer {key}").document_scope for name, key in KEYS.items()}
    assert scopes == {"alice": "key:alice", "bob": "key:bob", "carol": "share:team", "dave": "share:team"}
    assert ANONYMOUS.document_scope == "" and ApiKeys().identify(None).document_scope == ""
    path.write_text("sk-x share=\n")
    with pytest.raises(ConfigError, match="share="):
        ApiKeys.load({}, str(path))


def test_ids_are_keyed_by_the_secret_and_the_scope():
    tokens = torch.arange(50, dtype=torch.int64)
    one, other = DocumentNames(b"a" * 32), DocumentNames(b"b" * 32)
    doc = one.document_id("key:alice", "m", tokens)
    assert doc == one.document_id("key:alice", "m", tokens.clone()) and len(doc) == 32
    assert doc != other.document_id("key:alice", "m", tokens)        # knowing the text is not enough
    assert doc != one.document_id("key:bob", "m", tokens)             # each key its own id
    assert one.slot("key:alice", doc) != one.slot("key:bob", doc)     # another key's id: another slot
    assert one.slot("key:alice", doc) != doc and one.fingerprint() != other.fingerprint()
    assert len(DocumentNames().secret) == 64 and DocumentNames().secret != DocumentNames().secret


def test_a_configured_secret_is_long_and_never_printed():
    secret = "s3cr3t-" * 6
    config = service_config({"ILRE_DOCUMENT_SECRET": secret})
    assert config.document_secret == secret and secret not in repr(config)
    with pytest.raises(ConfigError, match="document_secret: must be at least 32 characters"):
        service_config({"ILRE_DOCUMENT_SECRET": "short"})


def test_rank_sum_p_value_equals_the_textbook_one():
    assert rank_sum_test([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(0.00902, abs=2e-5)  # U = 0, z = -2.611
    assert rank_sum_test([3.0, 3.0, 1.0], [3.0, 1.0, 3.0]) == pytest.approx(1.0)


@pytest.fixture
def scoped(engine):
    """The session engine with an empty document cache (put back after the test)."""
    kept = engine.documents
    engine.documents = DocumentCache(1 << 30)
    yield engine
    engine.documents = kept


def _miss(engine, scope: str, doc: str) -> str:
    with pytest.raises(NotFoundError) as err:
        engine.compress(CompressRequest(document_id=doc, query=QUERY, budget=32), scope)
    return str(err.value)


def test_a_document_is_found_only_from_its_scope(scoped):
    engine = scoped
    stored = engine.compress(CompressRequest(context=context(1), query=QUERY, budget=32), "key:alice")
    doc = stored.document_id
    again = engine.compress(CompressRequest(document_id=doc, query=QUERY, budget=32), "key:alice")
    assert again.kept_indices == stored.kept_indices
    unknown = _miss(engine, "key:bob", "0" * 32)
    assert _miss(engine, "key:bob", doc) == unknown == f"document_id: {NOT_FOUND_MESSAGE}"
    assert doc not in unknown
    misses = engine.documents.stats.misses["state", "local"]
    own = engine.compress(CompressRequest(context=context(1), query=QUERY, budget=32), "key:bob")
    assert own.document_id != doc and own.kept_indices == stored.kept_indices
    assert engine.documents.stats.misses["state", "local"] == misses + 1  # Bob's own prefill: nothing shared
    team = engine.compress(CompressRequest(context=context(2), query=QUERY, budget=32), "share:team")
    assert engine.compress(CompressRequest(document_id=team.document_id, query=QUERY, budget=32), "share:team")
    assert _miss(engine, "key:alice", team.document_id) == unknown
    open_doc = engine.compress(CompressRequest(context=context(3), query=QUERY, budget=32)).document_id  # keys off
    assert engine.compress(CompressRequest(document_id=open_doc, query=QUERY, budget=32)).document_id == open_doc
    assert _miss(engine, "key:alice", open_doc) == unknown


def test_a_cross_scope_miss_takes_the_time_of_an_unknown_id(scoped, redis_server):
    """Through both tiers (the shared one on a real Redis): Bob probing Alice's id and Bob probing
    ids never issued, interleaved at random; their times are one distribution (rank-sum test)."""
    engine = scoped
    store = RedisDocuments(redis_server.url, "scope-timing", 64 << 20, 60)
    engine.documents = DocumentCache(1 << 30, store)
    try:
        doc = engine.compress(CompressRequest(context=context(4), query=QUERY, budget=32), "key:alice").document_id
        rng = random.Random(7)
        kinds = ["cross"] * PROBES + ["unknown"] * PROBES
        rng.shuffle(kinds)
        times: dict[str, list[float]] = {"cross": [], "unknown": []}
        for kind in kinds:
            probe = doc if kind == "cross" else f"{rng.getrandbits(128):032x}"
            start = time.perf_counter()
            with pytest.raises(NotFoundError):
                engine.compress(CompressRequest(document_id=probe, query=QUERY, budget=32), "key:bob")
            times[kind].append(time.perf_counter() - start)
        assert engine.documents.stats.misses["ids", "shared"] >= 2 * PROBES  # every probe asked Redis
    finally:
        store.close()
    p = rank_sum_test(times["cross"], times["unknown"])
    assert p > 1e-3, (p, sorted(times["cross"])[PROBES // 2], sorted(times["unknown"])[PROBES // 2])


class Deployment:
    """A real redis-server, two `ilre worker` processes and one `ilre serve` front end, keys on."""

    def __init__(self, redis_server, keys_file: str):
        self.redis, self.keys_file, self.prefix = redis_server, keys_file, "scoped"
        self.client = redis_server.client()
        self.env = {"ILRE_REDIS_URL": redis_server.url, "ILRE_REDIS_PREFIX": self.prefix}
        self.workers: list[WorkerProcess] = []
        self.front: Served | None = None
        try:
            self.workers = [self.start_worker(name) for name in ("w1", "w2")]
            self.front = self.start_front()
        except BaseException:
            self.stop()
            raise

    def start_worker(self, name: str) -> WorkerProcess:
        return WorkerProcess(self.redis.url, self.prefix, name, "--max-wait-ms", "0")

    def start_front(self) -> Served:
        """`ilre serve` started while the workers load, then ready once they have registered."""
        front = Served("--api-keys-file", self.keys_file, "--log-format", "json", env=self.env)
        try:
            for worker in self.workers:
                worker.wait_registered(self.client)
            wait_for(front.ready, 120, "the front end to see a worker")
        except BaseException:
            front.proc.kill()
            raise
        return front

    def stop_front(self) -> None:
        if self.front is not None and self.front.proc.poll() is None:
            self.front.proc.terminate()
            self.front.proc.wait(60)

    def stop(self) -> None:
        self.stop_front()
        for worker in self.workers:
            worker.stop()

    def grpc(self, name: str) -> Client:
        return Client(self.front.grpc, api_key=KEYS[name], timeout=120)

    def http(self, name: str, path: str, body: dict) -> httpx.Response:
        return httpx.post(f"{self.front.http}{path}", json=body, headers={"authorization": f"Bearer {KEYS[name]}"},
                          timeout=120)


@pytest.fixture(scope="module")
def deployment(redis_server, tmp_path_factory):
    keys_file = tmp_path_factory.mktemp("scoped-keys") / "keys.txt"
    keys_file.write_text(KEYS_FILE)
    deployed = Deployment(redis_server, str(keys_file))
    yield deployed
    deployed.stop()


def _outcome(call) -> tuple:
    """What a caller sees: OK and the kept indices, or the error's code, field and message."""
    try:
        result = call()
    except ClientError as exc:
        return exc.code, exc.field, exc.message
    results = getattr(result, "results", [result])
    return "OK", [r.kept_indices for r in results]


def _paths(deployment: Deployment):
    """Every way a caller names a document by id: name -> probe(key name, document id) -> what it sees."""
    def grpc_one(name, doc):
        with deployment.grpc(name) as client:
            return _outcome(lambda: client.compress(document_id=doc, query=QUERY, budget=32))

    def grpc_many(name, doc):
        with deployment.grpc(name) as client:
            return _outcome(lambda: client.compress_queries(document_id=doc, queries=[QUERY, " Who?"], budget=32))

    def http(route, many: bool = False):
        def probe(name, doc):
            named = {"document_ids": [doc], "budgets": [32]} if many else {"document_id": doc, "budget": 32}
            reply = deployment.http(name, route, {**named, "query": QUERY})
            if reply.status_code == 200:
                if many:
                    return "OK", [r["kept_indices"] for r in reply.json()["results"]]
                return "OK", reply.json()["kept_indices"] if route == "/v1/compress" else reply.headers["content-type"]
            body = reply.json()
            return reply.status_code, body["code"], body["field"], body["error"]
        return probe

    def cli(name, doc):
        proc = subprocess.run([*ILRE, "compress", "--server", deployment.front.grpc, "--document-id", doc, "--query",
                               QUERY, "--budget", "32", "--json"], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "ILRE_API_KEY": KEYS[name]})
        return ("OK", json.loads(proc.stdout)["kept_indices"]) if proc.returncode == 0 else (proc.returncode, proc.stderr)

    return {"grpc.Compress": grpc_one, "grpc.CompressQueries": grpc_many, "http.compress": http("/v1/compress"),
            "http.compress document_ids": http("/v1/compress", many=True), "http.explain": http("/v1/explain"),
            "cli --server": cli}


def test_another_keys_document_is_not_found_on_every_path(deployment):
    with deployment.grpc("alice") as alice, deployment.grpc("carol") as carol, deployment.grpc("bob") as bob:
        stored = alice.compress(context(5), QUERY, budget=32)
        team = carol.compress(context(6), QUERY, budget=32)
        same_text = bob.compress(context(5), QUERY, budget=32)
    assert same_text.document_id != stored.document_id and same_text.kept_indices == stored.kept_indices
    unknown = "0123456789abcdef" * 2
    for path, probe in _paths(deployment).items():
        own = probe("alice", stored.document_id)
        assert own[0] == "OK", (path, own)
        assert probe("dave", team.document_id)[0] == "OK", path           # the share group reads its documents
        missing = probe("bob", unknown)
        assert missing[0] != "OK" and "document_id" in str(missing), (path, missing)  # document_ids[0] on that path
        for name, doc in (("bob", stored.document_id), ("carol", stored.document_id), ("alice", team.document_id)):
            assert probe(name, doc) == missing, (path, name)              # exactly what an unknown id gets
    log = "".join(deployment.front.lines)
    lines = [json.loads(line) for line in deployment.front.lines if line.startswith("{")]
    assert {"alice", "bob", "carol", "dave"} <= {line.get("key") for line in lines}
    assert stored.document_id not in log and team.document_id not in log
    metrics = httpx.get(f"{deployment.front.http}/metrics").text
    assert stored.document_id not in metrics and "alice" not in metrics


@pytest.mark.parametrize("field", ["document_id", "document_ids"])
def test_a_cross_key_probe_over_http_takes_the_time_of_an_unknown_one(deployment, field):
    with deployment.grpc("alice") as alice:
        doc = alice.compress(context(7), QUERY, budget=32).document_id
    rng = random.Random(11 if field == "document_id" else 12)
    kinds = ["cross"] * PROBES + ["unknown"] * PROBES
    rng.shuffle(kinds)
    times: dict[str, list[float]] = {"cross": [], "unknown": []}
    with httpx.Client(base_url=deployment.front.http, headers={"authorization": f"Bearer {KEYS['bob']}"},
                      timeout=60) as http:
        for kind in kinds:
            probe = doc if kind == "cross" else f"{rng.getrandbits(128):032x}"
            start = time.perf_counter()
            reply = http.post("/v1/compress", json={field: probe if field == "document_id" else [probe], "query": QUERY})
            times[kind].append(time.perf_counter() - start)
            assert reply.status_code == 404
    p = rank_sum_test(times["cross"], times["unknown"])
    assert p > 1e-3, (p, sorted(times["cross"])[PROBES // 2], sorted(times["unknown"])[PROBES // 2])


def test_restarts_keep_the_scoping_and_a_new_secret_forgets_every_id(deployment):
    """The secret lives on Redis: a new worker and a new front end name documents alike, so Alice's
    id still works (from the shared tier) and still not for Bob; a rotated secret makes it unknown."""
    with deployment.grpc("alice") as alice:
        stored = alice.compress(context(8), QUERY, budget=32)
    tool = context(9)
    gateway = deployment.http("alice", "/v1/compress", {"messages": [{"role": "tool", "content": tool}], "budget": 64})
    assert gateway.status_code == 200, gateway.text
    hash_ = gateway.json()["ccr_hashes"][0]
    held = deployment.client.get(f"{deployment.prefix}:document-secret")
    assert held and len(held) == 64
    deployment.stop_front()
    for worker in deployment.workers:
        worker.stop()
    deployment.workers = [deployment.start_worker("w3")]
    deployment.front = deployment.start_front()
    with deployment.grpc("alice") as alice, deployment.grpc("bob") as bob:
        again = alice.compress(document_id=stored.document_id, query=QUERY, budget=32)
        assert again.kept_indices == stored.kept_indices
        assert _outcome(lambda: bob.compress(document_id=stored.document_id, query=QUERY))[0] == "NOT_FOUND"
        for name, status in (("alice", 200), ("bob", 404)):  # a gateway's hash, from the shared tier, by its key only
            taken = httpx.get(f"{deployment.front.http}/v1/retrieve/{hash_}", timeout=120,
                              headers={"authorization": f"Bearer {KEYS[name]}"})
            assert taken.status_code == status and (status == 404 or taken.json()["original_content"] == tool), taken.text
        deployment.client.set(f"{deployment.prefix}:document-secret", "f" * 64)  # a rotation: one SET

        def forgotten() -> bool:
            return _outcome(lambda: alice.compress(document_id=stored.document_id, query=QUERY))[0] == "NOT_FOUND"
        wait_for(forgotten, 30, "the workers to adopt the new secret", interval=0.5)
        renamed = alice.compress(context(8), QUERY, budget=32)
        assert renamed.document_id != stored.document_id
        assert alice.compress(document_id=renamed.document_id, query=QUERY, budget=32).kept_indices == stored.kept_indices
