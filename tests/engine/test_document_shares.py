"""No caller can starve another: each owner (a caller's scope) holds a share of each document cache tier's cap.
A key flooding 10x the cache's capacity evicts its own oldest documents and never a quiet key's document within
its share, in process and on the shared Redis tier written by two workers; the evictions are counted by cause.
Deepening takes turns between keys: a quiet key's document is deepened next, on the real model too."""

from __future__ import annotations

import time
from functools import lru_cache

import httpx
import pytest
import torch

from ilre.compressor.prefill import encode_context
from ilre.contract.messages import CompressRequest
from ilre.engine.document_names import DocumentNames
from ilre.engine.documents import DocumentCache
from ilre.evaluation.tasks.haystack import shakespeare_text
from ilre.service.client import Client
from ilre.service.documents.redis_tier import RedisDocuments
from tests.service.conftest import WorkerProcess
from tests.tiny_models import random_ids

from .test_deepening import deepening_on
from .test_documents import CANDIDATES, CONFIG, tiny, tiny_state
from tests.shallow import engine_on_shallow_calibration  # noqa: F401 (engine: a flow, on the shallow calibration)


NAMES = DocumentNames(b"s" * 32)
QUIET, FLOOD = NAMES.owner("key:quiet"), NAMES.owner("key:flood")


def doc(owner: str, n: int) -> tuple[str, torch.Tensor]:
    ids = random_ids(40, seed=1000 * (owner == FLOOD) + n)
    return NAMES.slot(owner, NAMES.document_id(owner, "tiny", ids)), ids


@lru_cache(maxsize=None)
def state_of(n: int):
    """A tiny encoded state (the same size for every n: eviction reads sizes, not contents)."""
    return tiny_state(n % 4)


def store(cache: DocumentCache, owner: str, n: int) -> str:
    slot, ids = doc(owner, n)
    cache.remember(slot, ids, owner)
    cache.state(slot, "k", lambda: state_of(n), None)
    return slot


def per_document() -> int:
    slot, ids = doc(QUIET, 0)
    return ids.numel() * 8 + tiny_state(0).nbytes


def test_a_flooding_key_evicts_its_own_documents_never_a_quiet_keys_within_its_share():
    cache = DocumentCache(max_bytes=10 * per_document(), share=0.25)
    quiet = [store(cache, QUIET, n) for n in range(2)]  # the oldest, asked once: within its share of 2.5
    flood = [store(cache, FLOOD, n) for n in range(100)]  # 10x the capacity
    assert all(cache.holds(slot, "k") for slot in quiet)
    assert cache.holds(flood[-1], "k") and not cache.holds(flood[0], "k")  # its oldest went first
    assert cache.stats.evicted["own"] > 0 and cache.stats.evicted["pressure"] == 0
    assert cache.stats.bytes <= cache.max_bytes


def test_a_quiet_keys_spare_encoding_within_its_share_outlives_another_keys_pressure():
    """A conversation's end keeps its whole encoding beside its keys (the spare part, the cheapest to recompute): a
    key within its share keeps it however much another key floods; the flood pays with its own spare parts and
    documents, and the stats name whose pressure evicted what (none of the quiet key's)."""
    from ilre.engine.documents import KEYS_ONLY

    cache = DocumentCache(max_bytes=12 * per_document(), share=0.4)
    slot, ids = doc(QUIET, 0)
    cache.remember(slot, ids, QUIET)
    whole = state_of(0)
    cache.store_state(slot, "k", whole)
    cache.store_state(slot, "k" + KEYS_ONLY, whole.keys_only())
    for n in range(60):  # the flood's conversation ends, each with its spare part
        flood_slot, flood_ids = doc(FLOOD, n)
        cache.remember(flood_slot, flood_ids, FLOOD)
        cache.store_state(flood_slot, "k", state_of(n))
        cache.store_state(flood_slot, "k" + KEYS_ONLY, state_of(n).keys_only())
    assert cache.holds(slot, "k") and cache.holds(slot, "k" + KEYS_ONLY)
    assert cache.stats.evicted["own"] > 60 and cache.stats.evicted["pressure"] == 0
    assert not any(of == QUIET for _, of in cache.stats.pressure)
    quiet_again = doc(QUIET, 1)  # the quiet key's next document: over the cap, the flood over its share makes room
    cache.remember(quiet_again[0], quiet_again[1], QUIET)
    cache.state(quiet_again[0], "k", lambda: state_of(1), None)
    assert cache.holds(slot, "k") and cache.holds(quiet_again[0], "k")
    assert cache.stats.pressure[(QUIET, FLOOD)] > 0 and cache.stats.bytes <= cache.max_bytes


def test_a_key_over_its_share_gives_room_to_a_key_within_its_own():
    cache = DocumentCache(max_bytes=10 * per_document(), share=0.25)
    flood = [store(cache, FLOOD, n) for n in range(10)]  # the whole cache: a key may use what nobody else holds
    assert cache.stats.evictions == 0
    quiet = store(cache, QUIET, 0)
    assert cache.holds(quiet, "k") and not cache.holds(flood[0], "k")  # the flooder's oldest states made the room
    assert cache.stats.evicted["pressure"] == 2 and cache.stats.evicted["own"] == 0  # for the IDs, then the state


def test_a_quiet_keys_state_over_its_share_goes_but_its_document_id_stays():
    """A quiet key's one document whose state alone exceeds its share: a flood takes that state (over its share),
    never its IDs, so its document_id is still answered (its state recomputed)."""
    cache = DocumentCache(max_bytes=10 * per_document(), share=0.4)
    slot, ids = doc(QUIET, 0)
    cache.remember(slot, ids, QUIET)
    big = encode_context(tiny(), random_ids(800, seed=800), CONFIG)  # ~6.5 documents: over a share of 4, under the cap
    assert 0.4 * cache.max_bytes < big.nbytes < cache.max_bytes
    cache.state(slot, "k", lambda: big, None)
    assert cache.holds(slot, "k")
    for n in range(100):
        store(cache, FLOOD, n)
    assert cache.holds(slot) and not cache.holds(slot, "k")
    assert cache.stats.evicted["pressure"] == 1 and cache.stats.documents_evicted["pressure"] == 0
    assert cache.stats.evicted["own"] > 0  # the flood gave up its own oldest states


def test_a_writer_over_its_share_drops_its_new_state_before_a_quiet_keys_within_its_share():
    """The incoming entry counts against its writer's share first: a state too large for what the quiet key leaves
    is dropped (the request that brought it is answered), the quiet key's state within its share stays."""
    cache = DocumentCache(max_bytes=4 * per_document(), share=0.3)
    quiet = store(cache, QUIET, 0)
    slot, ids = doc(FLOOD, 0)
    cache.remember(slot, ids, FLOOD)
    big = encode_context(tiny(), random_ids(400, seed=400), CONFIG)  # under the cap, over what is left
    assert per_document() + big.nbytes > cache.max_bytes > big.nbytes
    assert cache.state(slot, "k", lambda: big, None) is big
    assert cache.holds(quiet, "k") and cache.holds(slot) and not cache.holds(slot, "k")
    assert cache.stats.evicted == {"own": 1} and not cache.stats.documents_evicted


def test_keys_off_is_one_share_as_before():
    """Every document in one scope: what goes is what went with no shares (one share the size of the cap)."""
    held = []
    for share in (0.125, 1.0):
        cache = DocumentCache(max_bytes=3 * per_document(), share=share)
        slots = [store(cache, "", n) for n in range(6)]
        held.append([(cache.holds(slot), cache.holds(slot, "k")) for slot in slots])
        assert cache.stats.evicted["pressure"] == 0 and cache.stats.evicted["own"] == cache.stats.evictions > 0
    assert held[0] == held[1] and held[0][-1] == (True, True)


@pytest.fixture()
def two_workers(redis_server, request):
    """Two workers' connections to one shared tier (each its own client, as two processes have)."""
    stores = [RedisDocuments(redis_server.url, prefix=f"shares-{request.node.name}", max_bytes=600_000, ttl_s=60,
                             share=0.3) for _ in range(2)]
    yield stores
    for one in stores:
        one.close()


def test_on_the_shared_tier_a_flood_through_one_worker_keeps_a_quiet_keys_documents_from_another(two_workers):
    quiet_worker, flood_worker = two_workers
    blob = {"x": torch.zeros(50_000, dtype=torch.uint8)}  # ~50 KB: the cap holds 11, a share 3 (as charged: entry overhead included)
    for n in range(2):
        quiet_worker.put_state(f"q{n:031x}", "k", blob, QUIET)
    for n in range(120):  # 10x the cap
        flood_worker.put_state(f"f{n:031x}", "k", blob, FLOOD)
    assert all(quiet_worker.get_state(f"q{n:031x}", "k") is not None for n in range(2))
    assert flood_worker.get_state(f"f{119:031x}", "k") is not None and flood_worker.get_state(f"f{0:031x}", "k") is None
    assert flood_worker.evicted["own"] >= 100 and flood_worker.evicted["pressure"] == 0
    sizes = flood_worker.client.hvals(flood_worker.sizes)
    assert sum(int(s) for s in sizes) <= flood_worker.max_bytes
    quiet_worker.put_state(f"q{2:031x}", "k", blob, QUIET)  # the quiet key's third: the flooder makes room
    assert quiet_worker.evicted == {"own": 0, "pressure": 1}
    assert all(quiet_worker.get_state(f"q{n:031x}", "k") is not None for n in range(3))


def test_a_quiet_keys_document_is_deepened_before_a_flooding_keys_backlog(engine):
    """The real model: a key sends three documents in one batch (three offers), a quiet key then sends one; the
    quiet one is deepened next, after at most the flooder's document already being deepened."""
    text = shakespeare_text()
    done: list[str] = []
    with deepening_on(engine) as on:
        keep_state = on.documents.store_state

        def stored(slot, key, state, replaces=None, owner=""):
            done.append(slot)
            return keep_state(slot, key, state, replaces, owner)
        on.documents.store_state = stored
        floods = [CompressRequest(context=text[n * 5000:(n + 1) * 5000], query=" Who speaks? Answer:", budget=200,
                                  strategy_options=CANDIDATES) for n in range(3)]
        on.compress_many(floods)  # one turn: three documents waiting
        asked = on.compress(CompressRequest(context=text[90_000:95_000], query=" Who speaks? Answer:", budget=200,
                                            strategy_options=CANDIDATES), "key:quiet")
        quiet = on.names.slot("key:quiet", asked.document_id)
        deadline = time.monotonic() + 300
        while quiet not in done and time.monotonic() < deadline:
            time.sleep(0.05)
        assert quiet in done and done.index(quiet) <= 1, done  # at most the one in progress went before


def test_two_workers_keep_a_quiet_keys_document_while_another_key_floods(redis_server, tmp_path):
    """`ilre serve` with keys and two `ilre worker` processes with small caches (8 MiB in process and on Redis, shares
    of 1/4): a key sends ten times the shared tier's capacity of new documents (1.3 MB each); the quiet key's
    document, sent before, is still answered by id, and the workers count every eviction as the flood's own."""
    from tests.engine.test_document_scope import Deployment
    from tests.service.conftest import free_port

    keys = tmp_path / "keys.txt"
    keys.write_text("sk-quiet-7c1d0e93 name=quiet\nsk-flood-2f8b6a41 name=flood\n")
    ports = [free_port(), free_port()]

    class Small(Deployment):
        def start_worker(self, name: str) -> WorkerProcess:
            return WorkerProcess(self.redis.url, self.prefix, name, "--max-wait-ms", "0", "--deepen", "off",
                                 "--doc-cache-mb", "8", "--doc-cache-shared-mb", "8", "--doc-cache-share", "0.25",
                                 "--metrics-port", str(ports[int(name[-1]) - 1]))

    deployed = Small(redis_server, str(keys))
    try:
        text = shakespeare_text()
        quiet = Client(deployed.front.grpc, api_key="sk-quiet-7c1d0e93", timeout=120)
        flood = Client(deployed.front.grpc, api_key="sk-flood-2f8b6a41", timeout=120)
        first = quiet.compress(text[:300], " Who speaks? Answer:", budget=16)
        for n in range(1, 66):  # ~10x the 8 MiB shared tier
            flood.compress(text[n * 300:(n + 1) * 300], " Who speaks? Answer:", budget=16)
        # read before the quiet key asks again: a worker that takes its document back from the shared tier makes room
        # by evicting the flood's entries over their share, which it rightly counts as pressure (not the flood's own)
        counts = {(tier, cause): 0.0 for tier in ("local", "shared") for cause in ("own", "pressure")}
        for port in ports:
            for line in httpx.get(f"http://127.0.0.1:{port}/metrics").text.splitlines():
                if line.startswith("ilre_doc_cache_evictions_total{"):
                    labels, value = line.split(" ")
                    named = dict(part.split("=") for part in labels[labels.index("{") + 1:-1].split(","))
                    counts[named["tier"].strip('"'), named["cause"].strip('"')] += float(value)
        assert counts["shared", "own"] > 0 and counts["local", "own"] > 0, counts
        assert counts["shared", "pressure"] == counts["local", "pressure"] == 0, counts
        again = quiet.compress(None, " Who speaks? Answer:", document_id=first.document_id, budget=16)
        assert again.kept_indices == first.kept_indices
    finally:
        deployed.stop()


def _metric_values(http: str, name: str) -> dict[str, float]:
    """{label text: value} of one metric family on a server's /metrics."""
    found = {}
    for line in httpx.get(f"{http}/metrics").text.splitlines():
        if line.startswith(name):
            labels, value = line.rsplit(" ", 1)
            found[labels[len(name):]] = float(value)
    return found


def test_a_served_quiet_keys_document_over_its_share_is_answered_by_id_after_a_flood(tmp_path):
    """`ilre serve` with two keys, an 8 MiB cache and shares of 1 MiB: the quiet key's one document (~4.8 MB
    encoded, over its share) is asked once; the other key sends ten documents of ~6.3 MB each. The quiet key's
    document_id is still answered (its state recomputed from the IDs it kept), with the same selection, and the
    metrics count its state evicted by pressure and no document's IDs by pressure."""
    from tests.service.conftest import served_by

    keys = tmp_path / "keys.txt"
    keys.write_text("sk-quiet-5e2a9c10 name=quiet\nsk-flood-8d4b1f77 name=flood\n")
    text, query = shakespeare_text(), " Who speaks? Answer:"
    with served_by("--api-keys-file", str(keys), "--doc-cache-mb", "8", "--doc-cache-share", "0.125", "--deepen", "off",
                   "--max-wait-ms", "0") as served:
        quiet = Client(served.grpc, api_key="sk-quiet-5e2a9c10", timeout=120)
        flood = Client(served.grpc, api_key="sk-flood-8d4b1f77", timeout=120)
        first = quiet.compress(text[:1200], query, budget=16)
        held = _metric_values(served.http, "ilre_doc_cache_bytes")
        assert 0.125 * (8 << 20) < sum(held.values()) < 8 << 20, held  # her share < her document < the cap
        for n in range(1, 11):
            flood.compress(text[n * 3000:(n + 1) * 3000], query, budget=16)
        again = quiet.compress(None, query, document_id=first.document_id, budget=16)
        assert again.kept_indices == first.kept_indices
        evictions = _metric_values(served.http, "ilre_doc_cache_evictions_total")
        assert evictions['{cause="pressure",tier="local"}'] >= 1, evictions  # her states (the cascade holds two)
        documents = _metric_values(served.http, "ilre_doc_cache_documents_evicted_total")
        assert documents['{cause="pressure"}'] == 0, documents  # the flood's own oldest may go whole, never hers


def test_a_served_quiet_keys_state_within_its_share_outlasts_a_flood_of_share_sized_documents(tmp_path):
    """The boundary: shares of half an 8 MiB cache, the quiet key's document (~3.6 MB) within its share, each
    flooding document about a share (~4.3-5.2 MB: with hers, over the cap): the writer's own new state goes,
    never the quiet key's, whose second question is then answered from its kept encoding."""
    from tests.service.conftest import served_by

    keys = tmp_path / "keys.txt"
    keys.write_text("sk-quiet-5e2a9c10 name=quiet\nsk-flood-8d4b1f77 name=flood\n")
    text, query = shakespeare_text(), " Who speaks? Answer:"
    share = 0.5 * (8 << 20)
    with served_by("--api-keys-file", str(keys), "--doc-cache-mb", "8", "--doc-cache-share", "0.5", "--deepen", "off",
                   "--max-wait-ms", "0") as served:
        quiet = Client(served.grpc, api_key="sk-quiet-5e2a9c10", timeout=120)
        flood = Client(served.grpc, api_key="sk-flood-8d4b1f77", timeout=120)
        first = quiet.compress(text[:900], query, budget=16)
        held = sum(_metric_values(served.http, "ilre_doc_cache_bytes").values())
        assert held < share, held
        at = 1000
        for chars in (1100, 1200, 1300) * 2:
            flood.compress(text[at:at + chars], query, budget=16)
            at += chars
        again = quiet.compress(None, query, document_id=first.document_id, budget=16)
        assert again.kept_indices == first.kept_indices
        hits = _metric_values(served.http, "ilre_doc_cache_hits_total")
        assert hits.get('{kind="state",tier="local"}', 0) >= 1, hits  # her encoding, kept through the flood
        evictions = _metric_values(served.http, "ilre_doc_cache_evictions_total")
        assert evictions['{cause="pressure",tier="local"}'] == 0 < evictions['{cause="own",tier="local"}'], evictions
