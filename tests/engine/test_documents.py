"""The document cache: the in-process LRU under its byte cap, the shared tier on a real
redis-server (cap, TTL, oversize), and the engine answering the same with and without it: a
repeated context, a document_id, several queries in one request, a state restored from Redis."""

from __future__ import annotations

import time
from functools import lru_cache

import pytest
import torch

from ilre.compressor.context_state import chunk_bounds
from tests.selecting import select_context_queries
from ilre.compressor.prefill import encode_context, extend_context
from ilre.compressor.prefill_config import PrefillConfig
from ilre.contract.messages import CompressRequest, CompressResults, InputError, NotFoundError
from ilre.engine.document_names import DocumentNames
from ilre.engine.documents import DocumentCache, KEYS_ONLY, state_key
from ilre.engine.engine import NOT_FOUND_MESSAGE
from ilre.evaluation.tasks.haystack import shakespeare_text
from ilre.models.loader import load_truncated
from ilre.service.documents.redis_tier import RedisDocuments, charged
from tests.tiny_models import N_LAYERS, random_ids, tiny_checkpoint

from tests.service.conftest import comparable
from tests.shallow import engine_on_shallow_calibration  # noqa: F401 (engine: a flow, on the shallow calibration)


CONFIG = PrefillConfig(sink=2, window=5, chunk=7)
CANDIDATES = {"deepen_below": 0.0, "coarse_below": 0.0}  # the cascade on its candidates alone: these tests are about the cache
QUESTIONS = [" Question: who holds the key to the vault? Answer:", " Question: what is the vault code? Answer:",
             " Question: when does the ship leave? Answer:"]


@lru_cache(maxsize=None)
def tiny():
    return load_truncated(tiny_checkpoint("llama"), N_LAYERS)


def tiny_state(seed: int):
    return encode_context(tiny(), random_ids(40, seed=seed), CONFIG)


NAMES = DocumentNames(b"s" * 32)


def document(seed: int) -> tuple[str, torch.Tensor]:
    ids = random_ids(40, seed=seed)
    return NAMES.document_id("", "tiny", ids), ids


def test_document_ids_name_model_and_tokens():
    ids = random_ids(40, seed=1)
    name = NAMES.document_id
    assert name("", "a", ids) == name("", "a", ids.clone()) and len(name("", "a", ids)) == 32
    assert name("", "a", ids) != name("", "b", ids)
    assert name("", "a", ids) != name("", "a", torch.cat((ids, ids[:1])))


def test_lru_evicts_least_recently_used_documents_under_the_byte_cap():
    docs = [document(seed) for seed in range(3)]
    per_doc = docs[0][1].numel() * 8 + tiny_state(0).nbytes
    cache = DocumentCache(max_bytes=2 * per_doc + 100)
    for seed, (doc, ids) in enumerate(docs[:2]):
        cache.remember(doc, ids)
        cache.state(doc, "k", lambda seed=seed: tiny_state(seed), None)
    assert cache.stats.bytes == 2 * per_doc and cache.stats.evictions == 0
    assert cache.ids(docs[0][0]) is not None  # document 0 is now the most recently used
    cache.remember(*docs[2])
    cache.state(docs[2][0], "k", lambda: tiny_state(2), None)
    assert cache.ids(docs[1][0]) is None and cache.ids(docs[0][0]) is not None  # 1 went, not 0
    assert cache.stats.evictions == 2 and cache.stats.bytes <= cache.max_bytes  # 1's state, then its IDs
    encoded = []
    cache.state(docs[0][0], "k", lambda: encoded.append(1), None)  # still cached: no encode
    assert not encoded and cache.stats.hits["state", "local"] == 1


def test_states_of_one_off_documents_go_before_a_document_named_again():
    hot, once = document(10), [document(seed) for seed in (11, 12, 13)]
    per_doc = hot[1].numel() * 8 + tiny_state(0).nbytes
    cache = DocumentCache(max_bytes=2 * per_doc + 100)
    cache.remember(*hot)
    cache.state(hot[0], "k", lambda: tiny_state(10), None)
    assert cache.ids(hot[0]) is not None  # named again
    for seed, (doc, ids) in zip((11, 12, 13), once):  # each alone would push the hot one out of an LRU
        cache.remember(doc, ids)
        cache.state(doc, "k", lambda seed=seed: tiny_state(seed), None)
    encoded = []
    cache.state(hot[0], "k", lambda: encoded.append(1), None)
    assert not encoded and cache.ids(hot[0]) is not None
    assert cache.ids(once[0][0]) is None and cache.ids(once[2][0]) is not None  # the oldest one-off went whole
    assert cache.stats.bytes <= cache.max_bytes


def test_a_messages_whole_encoding_beside_its_keys_goes_first_under_pressure():
    """The whole encoding a conversation's end keeps beside its keys (windows and resume point, recomputed from the IDs
    when asked) is dropped before any document or state that has no stand-in, even the least recently used one."""
    old, end, new = document(20), document(21), document(22)
    whole = tiny_state(21)
    per_doc = old[1].numel() * 8 + tiny_state(20).nbytes
    cache = DocumentCache(max_bytes=3 * per_doc)  # all three whole, less the end's keys-only twin
    cache.remember(*old)
    cache.state(old[0], "k", lambda: tiny_state(20), None)
    cache.remember(*end)
    cache.store_state(end[0], "k", whole)
    cache.store_state(end[0], "k" + KEYS_ONLY, whole.keys_only())
    assert cache.stats.evictions == 0
    cache.remember(*new)
    cache.state(new[0], "k", lambda: tiny_state(22), None)  # over the cap by about one whole state
    assert cache.holds(old[0], "k") and cache.holds(new[0], "k")  # the oldest document kept its state
    assert cache.holds(end[0], "k" + KEYS_ONLY) and not cache.holds(end[0], "k")  # the end's whole went, its keys stay
    assert cache.stats.evictions == 1 and cache.stats.bytes <= cache.max_bytes
    assert cache._docs[end[0]].part_bytes()["windows"] == 0


def test_a_document_larger_than_the_cap_keeps_its_ids_not_its_states():
    doc, ids = document(5)
    cache = DocumentCache(max_bytes=ids.numel() * 8 + 10)
    cache.remember(doc, ids)
    state = cache.state(doc, "k", lambda: tiny_state(5), None)
    assert state.length == 40  # still served, just not kept
    assert torch.equal(cache.ids(doc), ids) and cache.stats.bytes == ids.numel() * 8
    off = DocumentCache(max_bytes=0)
    off.remember(doc, ids)
    assert off.ids(doc) is None and off.stats.bytes == 0


def test_a_growing_conversation_stays_under_the_byte_cap_with_its_resume_points():
    """Each turn takes the previous one's encoding on and is kept with its own resume point (the lower layers'
    windows as they stood at its last chunk boundary), which the cache counts: under a cap of about three turns
    the cache never holds more than the cap, the turns that went are no longer offered as prefixes, and every
    turn still finds the one before it."""
    context = random_ids(140, seed=21)
    turns = [(NAMES.document_id("", "tiny", context[:n]), context[:n]) for n in range(40, 141, 20)]
    first = encode_context(tiny(), turns[0][1], CONFIG)
    assert first.resume is not None and first.resume.nbytes > 0
    cache = DocumentCache(max_bytes=3 * (turns[2][1].numel() * 8 + encode_context(tiny(), turns[2][1], CONFIG).nbytes))
    for n, (slot, ids) in enumerate(turns):
        ends = [end for _, end in chunk_bounds(ids.numel(), CONFIG)[:-1]][::-1]
        found = cache.resumable(list(zip(ends, NAMES.prefix_slots("", "tiny", ids, ends[::-1])[::-1])), "k", None)
        assert (found is not None) == (n > 0), n  # the turn before is always held
        state = extend_context(tiny(), found, ids) if found is not None else encode_context(tiny(), ids, CONFIG)
        cache.remember(slot, ids)
        cache.store_state(slot, "k", state)
        cache.name_prefix(NAMES.prefix_slots("", "tiny", ids, [state.resume.at])[0], slot)
        held = {s: entry for s, entry in cache._docs.items()}
        assert cache.stats.bytes == sum(entry.nbytes for entry in held.values()) <= cache.max_bytes
        stored = sum(t.numel() * t.element_size() for t in state.to_tensors().values())
        assert 0 <= stored - state.nbytes <= 512  # the count is what is stored, resume windows included (and scalars)
        assert set(cache._prefixes.values()) <= set(held)  # no prefix names a document that went
    assert cache.stats.evictions > 0 and not cache.holds(turns[0][0], "k")  # the oldest turns went (their states first)


def test_the_counted_bytes_follow_every_change_as_a_full_recount_would():
    """Eviction keeps each owner's bytes and the documents holding states as documents change, rather than reading
    every document held (a long job leaves thousands holding only their IDs): after each of a few hundred mixed
    calls (stores, a state replaced, its keys-only twin, a state dropped, a document grown in place, lookups) from
    three owners under a cap of a few states, the counts equal a recount of what is held, the cap holds, and the
    documents the states passes read are exactly those holding states, least recently used first."""
    import random

    rng = random.Random(7)
    states = [tiny_state(seed) for seed in range(6)]
    docs = [document(100 + n) for n in range(40)]
    cache = DocumentCache(max_bytes=4 * (docs[0][1].numel() * 8 + states[0].nbytes), share=0.5)
    evicted_whole = 0
    for step in range(400):
        slot, ids = rng.choice(docs)
        owner, state, call = rng.choice("abc"), rng.choice(states), rng.randrange(7)
        if call == 0:
            cache.remember(slot, ids, owner)
        elif call == 1:
            cache.remember(slot, ids, owner)
            cache.state(slot, "k", lambda state=state: state, None, owner)
        elif call == 2:
            cache.store_state(slot, "k2", state, replaces="k", owner=owner)
        elif call == 3:
            cache.store_state(slot, "k2" + KEYS_ONLY, state.keys_only(), owner=owner)
        elif call == 4:
            cache.drop_state(slot, rng.choice(["k", "k2"]))
        elif call == 5:
            cache.refit(slot)
        else:
            cache.ids(slot)
        held = cache._docs
        used: dict[str, int] = {}
        for entry in held.values():
            used[entry.owner] = used.get(entry.owner, 0) + entry.nbytes
        assert dict(cache._used) == {o: b for o, b in used.items() if b > 0}, step
        assert cache.stats.bytes == sum(used.values()) <= cache.max_bytes, step
        assert list(cache._stateful) == [s for s, entry in held.items() if entry.states], step
        evicted_whole = sum(cache.stats.documents_evicted.values())
    assert cache.stats.evictions > 50 and evicted_whole > 0  # the cap was under pressure throughout

@pytest.fixture()
def shared(redis_server, request):
    store = RedisDocuments(redis_server.url, prefix=f"docs-{request.node.name}", max_bytes=1 << 20, ttl_s=60)
    yield store
    store.close()


def test_shared_store_round_trip(shared):
    doc, ids = document(7)
    state = tiny_state(7)
    shared.put_ids(doc, ids)
    shared.put_state(doc, "k", state.to_tensors())
    assert torch.equal(shared.get_ids(doc), ids)
    tensors = shared.get_state(doc, "k")
    assert set(tensors) == set(state.to_tensors()) and all(torch.equal(tensors[n], t) for n, t in state.to_tensors().items())
    assert shared.get_ids("0" * 32) is None and shared.get_state(doc, "other") is None


def test_shared_store_evicts_oldest_under_its_cap_and_skips_oversize(shared, redis_server):
    blob = {"x": torch.zeros(60_000, dtype=torch.uint8)}  # ~60 KB each
    shared.max_bytes = 150_000
    for i in range(3):
        shared.put_state(f"{i:032x}", "k", blob)
        time.sleep(0.01)
    assert shared.get_state(f"{0:032x}", "k") is None  # the oldest went to make room
    assert shared.get_state(f"{1:032x}", "k") is not None and shared.get_state(f"{2:032x}", "k") is not None
    assert shared.evictions == 1
    sizes = redis_server.client().hvals(shared.sizes)
    assert sum(int(s) for s in sizes) <= shared.max_bytes
    shared.put_state(f"{9:032x}", "k", {"x": torch.zeros(200_000, dtype=torch.uint8)})
    assert shared.get_state(f"{9:032x}", "k") is None  # larger than the cap: not stored


def test_shared_store_evicts_states_before_ids(shared):
    shared.max_bytes = 150_000
    doc, ids = document(9)
    shared.put_ids(doc, ids)  # the oldest entry, yet kept: without it the document_id is unknown
    for i in range(4):
        shared.put_state(f"{i:032x}", "k", {"x": torch.zeros(60_000, dtype=torch.uint8)})
        time.sleep(0.01)
    assert torch.equal(shared.get_ids(doc), ids)
    assert shared.get_state(f"{1:032x}", "k") is None and shared.get_state(f"{3:032x}", "k") is not None


def shared_counts(store: RedisDocuments, client) -> tuple[dict, dict, dict, dict]:
    """What the store keeps as entries change (each owner's bytes; per kind and owner, its entries by last use),
    beside the same recounted from every entry's size, owner and last use."""
    sizes, owners = client.hgetall(store.sizes), client.hgetall(store.owners)
    used: dict[str, int] = {}
    order: dict[str, list] = {}
    for name, score in client.zrange(store.index, 0, -1, withscores=True):
        who, kind = owners[name], "s" if ":state:" in name else "i"
        used[who] = used.get(who, 0) + int(sizes[name])
        order.setdefault(f"{store.lru_prefix}{kind}:{who}", []).append((name, score))
    kept = {o: int(b) for o, b in client.hgetall(store.used).items()}
    lists = {key: client.zrange(key, 0, -1, withscores=True) for key in client.keys(store.lru_prefix + "*")}
    return kept, used, lists, order


def test_the_shared_tier_keeps_its_counts_as_a_full_recount_would(shared, redis_server):
    """A write reads the owners' totals and the oldest entry of each owner it may evict from, kept as entries
    change, not every entry held: after each of a few hundred mixed calls from three owners (IDs, states, reads,
    a state dropped) under a cap of a few entries, the kept counts equal a recount and the cap holds."""
    import random

    rng, client = random.Random(3), redis_server.client()
    shared.max_bytes, shared.share = 200_000, 0.4
    for step in range(300):
        doc, owner, call = f"{rng.randrange(30):032x}", rng.choice("abc"), rng.randrange(4)
        if call == 0:
            shared.put_ids(doc, random_ids(40, seed=step), owner)
        elif call == 1:
            shared.put_state(doc, "k", {"x": torch.zeros(rng.randrange(10_000, 40_000), dtype=torch.uint8)}, owner)
        elif call == 2:
            shared.get_state(doc, "k") if rng.random() < 0.5 else shared.get_ids(doc)
        else:
            shared.drop_state(doc, "k")
        kept, used, lists, order = shared_counts(shared, client)
        assert kept == used and lists == order, step
        assert sum(used.values()) <= shared.max_bytes, step
    assert shared.evicted["own"] > 20 and shared.evicted["pressure"] > 5  # both turns ran


def test_the_shared_tier_takes_over_a_store_written_before_it_kept_counts(shared, redis_server):
    """Entries written with only the index, sizes and owners (the layout before the kept counts) are counted by
    the first write, which then evicts the oldest state to make room as before."""
    client = redis_server.client()
    shared.max_bytes = 150_000
    for i, who in enumerate("ab"):
        name = shared._state_key(f"{i:032x}", "k")
        client.set(name, b"x" * 60_000, ex=60)
        client.zadd(shared.index, {name: time.time() - 10 + i})
        client.hset(shared.sizes, name, charged(60_000, name))
        client.hset(shared.owners, name, who)
    shared.put_state(f"{9:032x}", "k", {"x": torch.zeros(60_000, dtype=torch.uint8)}, "a")
    assert client.get(shared._state_key(f"{0:032x}", "k")) is None and shared.evictions == 1
    kept, used, lists, order = shared_counts(shared, client)
    assert kept == used and lists == order and set(used) == {"a", "b"}


def test_an_entry_is_charged_at_least_what_redis_holds_for_it(shared, redis_server):
    """The cap bounds the tier's share of Redis's used memory: over 1,200 IDs and states of 0.6-20 KB (the IDs
    of 150-5,000-token documents), named under this test's long prefix, the bytes charged cover what Redis's used
    memory grew by, and not by much more."""
    client = redis_server.client()
    shared.max_bytes = 1 << 30
    before = client.info("memory")["used_memory"]
    for i in range(1200):
        size = (600, 4_000, 20_000)[i % 3]
        if i % 2:
            shared.put_state(f"{i:032x}", "l8-s4-w1024-c1024-dca0-bfloat16", {"x": torch.zeros(size, dtype=torch.uint8)},
                             "0123456789abcdef")
        else:
            shared.put_ids(f"{i:032x}", torch.zeros(size // 4, dtype=torch.int64), "0123456789abcdef")
    grown = client.info("memory")["used_memory"] - before
    charged_bytes = sum(int(n) for n in client.hvals(shared.sizes))
    assert grown <= charged_bytes <= 1.1 * grown, (grown, charged_bytes)


def test_shared_store_entries_expire(shared):
    shared.ttl_s = 1
    doc, ids = document(8)
    shared.put_ids(doc, ids)
    assert shared.get_ids(doc) is not None
    time.sleep(2.2)
    assert shared.get_ids(doc) is None


# --- the engine, on the embedded model ---------------------------------------------------------

@lru_cache(maxsize=None)
def long_text() -> str:
    """~2.8K tokens (three prefill chunks) with the vault code at two thirds."""
    return shakespeare_text()[:6000] + " The vault code is 7719. " + shakespeare_text()[6000:9000]


@pytest.fixture()
def uncached(engine):
    """The session engine with its document cache switched off for the duration of a test."""
    kept = engine.documents
    engine.documents = DocumentCache(0)
    yield engine
    engine.documents = kept


def fresh(engine) -> DocumentCache:
    engine.documents = DocumentCache(1 << 30)
    return engine.documents


@pytest.mark.parametrize("strategy", ["cascade", "ilre", "snapkv", "streaming_llm"])
def test_cached_results_equal_uncached(engine, strategy):
    options = CANDIDATES if strategy == "cascade" else {}
    request = CompressRequest(context=long_text(), query=QUESTIONS[1], budget=200, strategy=strategy, dca="on",
                              strategy_options=options)
    kept = engine.documents
    try:
        engine.documents = DocumentCache(0)
        baseline = comparable(engine.compress(request))
        cache = fresh(engine)
        stored = engine.compress(request)
        first, second = comparable(stored), comparable(engine.compress(request))
        by_id = comparable(engine.compress(CompressRequest(document_id=stored.document_id, query=QUESTIONS[1],
                                                           budget=200, strategy=strategy, dca="on",
                                                           strategy_options=options)))
    finally:
        engine.documents = kept
    assert first == second == by_id == baseline
    assert baseline["original_tokens"] > 2 * 1024  # several prefill chunks, DCA on
    if strategy != "streaming_llm":
        assert cache.stats.hits["state", "local"] == 2 and cache.stats.misses["state", "local"] == 1


def test_a_lower_layers_keys_are_cached_under_their_own_key(engine):
    two = {"also_layers": [engine.layer - 2]}
    request = CompressRequest(context=long_text(), query=QUESTIONS[1], budget=200, strategy="ilre", strategy_options=two)
    kept = engine.documents
    try:
        engine.documents = DocumentCache(0)
        baseline = comparable(engine.compress(request))
        cache = fresh(engine)
        plain = comparable(engine.compress(CompressRequest(context=long_text(), query=QUESTIONS[1], budget=200, strategy="ilre")))
        first, second = comparable(engine.compress(request)), comparable(engine.compress(request))
    finally:
        engine.documents = kept
    assert first == second == baseline  # encoded once with the lower layer's keys, then reused
    assert cache.stats.misses["state", "local"] == 2 and cache.stats.hits["state", "local"] == 1
    assert plain["kept_indices"] != first["kept_indices"]  # the lower layer's attention changed the choice
    with pytest.raises(InputError, match=f"also_layers: every layer must be below l_R = {engine.layer}"):
        engine.compress(CompressRequest(context=long_text(), query=QUESTIONS[1], strategy="ilre",
                                        strategy_options={"also_layers": [engine.layer]}))


def test_several_queries_in_one_request_equal_separate_requests_but_the_cascades(engine, uncached):
    """Questions sent together share one prefill and answer as sent apart, for a strategy with nothing more to
    share (plain ILRe); the cascade's questions also share one candidate pass (the union of their candidates,
    tests/compressor/test_shared_candidates.py), so together they are the pipeline's answers to all of them."""
    ids = [uncached.tokenizer(q, add_special_tokens=False).input_ids for q in QUESTIONS]
    text = long_text()[:6000]  # ~1.5K tokens: each question's 256 candidates, their union cheaper than reading it to l_R
    for strategy in ("ilre", "cascade"):
        alone = [uncached.compress(CompressRequest(context=text, query=q, budget=64, strategy=strategy))
                 for q in QUESTIONS]
        together = uncached.compress(CompressRequest(context=text, queries=QUESTIONS, budget=64, id="m",
                                                     strategy=strategy))
        assert isinstance(together, CompressResults) and together.id == "m"
        assert together.document_id == alone[0].document_id
        by_ids = uncached.compress(CompressRequest(context=text, queries_ids=ids, budget=64, strategy=strategy))
        assert [r.kept_indices for r in by_ids.results] == [r.kept_indices for r in together.results]
        if strategy == "ilre":
            assert [comparable(r) for r in together.results] == [comparable(r) for r in alone]
            continue
        job = uncached.prepare(CompressRequest(context=text, queries=QUESTIONS, budget=64), "")
        direct = select_context_queries(job.model, job.context_ids, job.queries, 64, job.strategy, job.prefill, job.units)
        assert [r.kept_indices for r in together.results] == [s.kept.tolist() for s in direct]
        assert all(s.measured.get("candidates") for s in direct)  # one candidate pass, shared
        assert [r.kept_indices for r in together.results] != [r.kept_indices for r in alone]  # the union answers


def test_unknown_document_id_is_not_found_naming_the_field(engine):
    with pytest.raises(NotFoundError) as err:
        engine.compress(CompressRequest(document_id="0" * 32, query=QUESTIONS[0]))
    assert err.value.field == "document_id" and "send the context again" in str(err.value)
    with pytest.raises(InputError, match="document_id: must be the 32 hex digits"):
        CompressRequest(document_id="nope", query=QUESTIONS[0])
    with pytest.raises(InputError, match="document_id: give either a context or a document_id"):
        CompressRequest(document_id="0" * 32, context="x", query=QUESTIONS[0])
    with pytest.raises(InputError, match="queries: 65 queries exceed the limit of 64"):
        CompressRequest(context="x", queries=["q"] * 65)
    with pytest.raises(InputError, match=r"queries\[1\]: must be a non-empty string"):
        CompressRequest(context="x", queries=["q", ""])
    with pytest.raises(InputError, match="queries: give one of query, query_ids, queries, queries_ids"):
        CompressRequest(context="x", query="q", queries=["q"])


def test_state_restored_from_the_shared_tier_gives_the_same_result(engine, redis_server):
    store = RedisDocuments(redis_server.url, prefix="docs-restore", max_bytes=1 << 30, ttl_s=60)
    kept = engine.documents
    try:
        engine.documents = DocumentCache(1 << 30, store)
        first = engine.compress(CompressRequest(context=long_text(), query=QUESTIONS[1], budget=200,
                                                strategy_options=CANDIDATES))
        engine.documents = DocumentCache(1 << 30, store)  # another process: nothing local
        again = engine.compress(CompressRequest(document_id=first.document_id, query=QUESTIONS[1], budget=200,
                                                strategy_options=CANDIDATES))
        stats = engine.documents.stats
    finally:
        engine.documents = kept
        store.close()
    assert comparable(again) == comparable(first)
    assert stats.hits["ids", "shared"] == 1 and stats.hits["state", "shared"] == 1
    key = state_key(first.layer, PrefillConfig(dca=first.dca), engine.placement.dtype_name)
    assert key.startswith(f"l{first.layer}-s4-w512-c1024-dca{int(first.dca)}-")


def test_batch_lines_repeating_a_context_reuse_its_prefill(engine, tmp_path):
    import json

    from ilre.cli.batch import run_batch_file

    lines = [{"id": i, "context": long_text(), "query": q, "budget": 150, "strategy_options": CANDIDATES}
             for i, q in enumerate(QUESTIONS)]
    lines.append({"id": "again", "document_id": "0" * 32, "query": QUESTIONS[0]})
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    kept = engine.documents
    try:
        cache = fresh(engine)
        assert run_batch_file(engine, source, target, {}) == 0
    finally:
        engine.documents = kept
    out = [json.loads(line) for line in target.read_text().splitlines()]
    assert len({r["document_id"] for r in out[:3]}) == 1
    assert cache.stats.misses["state", "local"] == 1 and cache.stats.hits["state", "local"] == 2
    assert out[3] == {"id": "again", "error": f"document_id: {NOT_FOUND_MESSAGE}"}


def test_bad_queries_name_their_index(engine):
    with pytest.raises(InputError) as err:
        engine.compress(CompressRequest(context="some text here", queries_ids=[[5, 6], [7, 10 ** 7]], budget=2))
    assert err.value.field == "queries_ids[1]" and "outside the vocabulary" in str(err.value)
    with pytest.raises(InputError) as err:
        engine.compress(CompressRequest(context="some text here", queries=["ok", "why " * 5000], budget=2))
    assert err.value.field == "queries[1]" and "exceed the limit of 4096 (max_query_tokens)" in str(err.value)


def live_kv_bytes(engine, state) -> int:
    """What a later query reads: per layer below the state's top layer min(L, S + W) K and V entries,
    and the top layer's keys of all L tokens (and a lower score layer's, where the strategy keeps one); and what a
    longer context takes on: where the context ends inside a chunk, those windows as they stood before it."""
    spec, config = engine.spec, state.config
    entry = spec.num_kv_heads * spec.head_dim * next(iter(state.keys.values())).element_size()
    window = min(state.length, config.sink + config.window)
    windows = (max(state.keys) - 1) * window * 2 * entry
    resume = windows if state.resume is not None and state.resume.caches is not None else 0
    return windows + len(state.keys) * state.length * entry + resume


@pytest.mark.parametrize("chars", [3_000, 30_000])  # ~700 and ~7,000 tokens
def test_a_cached_document_costs_what_a_later_query_reads(engine, redis_server, chars):
    from safetensors.torch import save

    store = RedisDocuments(redis_server.url, prefix=f"docs-bytes-{chars}", max_bytes=1 << 30, ttl_s=60)
    kept = engine.documents
    try:
        cache = engine.documents = DocumentCache(1 << 30, store)
        result = engine.compress(CompressRequest(context=shakespeare_text()[:chars], query=QUESTIONS[0], budget=64,
                                                 granularity="token",  # no unit bounds beside the state
                                                 strategy_options=CANDIDATES))
        entry = cache._docs[engine.names.slot('', result.document_id)]
        (key, state), = entry.states.items()
        stored = {(n if isinstance(n, str) else n.decode()): int(size)
                  for n, size in redis_server.client().hgetall(store.sizes).items()}
    finally:
        engine.documents = kept
        store.close()
    live = live_kv_bytes(engine, state)
    assert state.nbytes <= 1.25 * live, (state.nbytes, live)
    assert cache.stats.bytes == entry.nbytes == result.original_tokens * 8 + state.nbytes  # the IDs, the tensors
    blob = len(save(state.to_tensors()))
    assert state.nbytes <= blob <= state.nbytes + 16 << 10  # the serialised size: the tensors and a header
    # charged on Redis: the serialised size, plus what Redis holds besides (redis_tier.charged)
    name = store._state_key(engine.names.slot('', result.document_id), key)
    assert stored[name] == charged(blob, name)
    assert blob <= 1.25 * live + (16 << 10)


def test_a_burst_of_one_off_documents_keeps_a_document_asked_again(engine):
    """Real sizes: a ~300-token document asked twice, then by id after every third of ten ~1.6K-token
    documents seen once; the cache holds about two and a half of those. An LRU would evict the small one; here
    it is encoded once and never unknown."""
    text = shakespeare_text()
    hot = engine.compress(CompressRequest(context=text[:1_300], query=QUESTIONS[0], budget=64,
                                          strategy_options=CANDIDATES))
    kept = engine.documents
    try:
        cache = engine.documents = DocumentCache(1 << 30)
        engine.compress(CompressRequest(context=text[:1_300], query=QUESTIONS[0], budget=64, strategy_options=CANDIDATES))
        engine.compress(CompressRequest(document_id=hot.document_id, query=QUESTIONS[0], budget=64,
                                        strategy_options=CANDIDATES))  # asked again
        sizes = []
        for i in range(10):
            burst = engine.compress(CompressRequest(context=text[20_000 * (i + 1):20_000 * (i + 1) + 6_500],
                                                    query=QUESTIONS[1], budget=64, strategy_options=CANDIDATES))
            sizes.append(cache._docs[engine.names.slot('', burst.document_id)].nbytes)
            if i == 0:
                cache.max_bytes = int(2.5 * sizes[0]) + cache._docs[engine.names.slot('', hot.document_id)].nbytes
            if i % 3 == 2:
                again = engine.compress(CompressRequest(document_id=hot.document_id, query=QUESTIONS[0], budget=64,
                                                        strategy_options=CANDIDATES))
                assert again.kept_indices == hot.kept_indices
    finally:
        engine.documents = kept
    assert 3 * min(sizes) > 2.5 * sizes[0]  # three one-offs between two asks overflow it: LRU would lose the hot one
    assert cache.stats.misses["state", "local"] == 11 and cache.stats.hits["state", "local"] == 4  # hot encoded once
    assert cache.stats.evictions >= 8 and cache.stats.bytes <= cache.max_bytes


def test_a_documents_units_and_table_headers_come_back_from_the_shared_tier(engine, redis_server):
    """A CSV document cut into units (rows and their header) by one process is read back by another from
    Redis: the same bounds and headers, not computed again, and the same selection."""
    store = RedisDocuments(redis_server.url, prefix="docs-units", max_bytes=1 << 30, ttl_s=60)
    table = "name,team,calls\n" + "".join(f"row-{k},{['ml', 'web'][k % 2]},{1000 + 37 * k}\n" for k in range(300))
    query = "Question: What is the calls of the row whose name is row-123? Answer:"
    kept = engine.documents
    try:
        engine.documents = DocumentCache(1 << 30, store)
        first = engine.compress(CompressRequest(context=table, query=query, budget=64, granularity="unit"))
        slot = engine.names.slot("", first.document_id)
        (key, computed), = engine.documents._docs[slot].units.items()
        assert int((computed.heads[:, 0] >= 0).sum()) == 301  # the header and every row
        engine.documents = DocumentCache(1 << 30, store)  # another process: only Redis holds the document
        again = engine.compress(CompressRequest(document_id=first.document_id, query=query, budget=64, granularity="unit"))
        restored = engine.documents._docs[slot].units[key]
        assert engine.documents.stats.hits["units", "shared"] == 1
        assert torch.equal(restored.bounds, computed.bounds) and torch.equal(restored.heads, computed.heads)
        assert again.kept_indices == first.kept_indices and again.kept_spans == first.kept_spans
    finally:
        engine.documents = kept
        store.close()


def test_a_text_sent_again_is_not_tokenized_again_while_its_ids_are_held(engine, monkeypatch):
    """A context sent again as text by the same scope reads its IDs from the document cache (no tokenizing), and
    is tokenized again from another scope or once the cache no longer holds them: the same document either way."""
    import ilre.engine.prepared as prepared

    text, tokenized = long_text()[:3000], []
    real = prepared.tokenize_text
    monkeypatch.setattr(prepared, "tokenize_text",
                        lambda tokenizer, piece, limit: tokenized.append(piece == text) or real(tokenizer, piece, limit))
    kept = engine.documents
    try:
        engine.documents = DocumentCache(1 << 30)
        first = engine.compress(CompressRequest(context=text, query=QUESTIONS[0], budget=64))
        again = engine.compress(CompressRequest(context=text, query=QUESTIONS[1], budget=64))
        assert tokenized.count(True) == 1
        other = engine.run(CompressRequest(context=text, query=QUESTIONS[1], budget=64), "key:b").results[0]
        assert tokenized.count(True) == 2 and other.document_id != first.document_id
        engine.documents = DocumentCache(1 << 30)  # the IDs no longer held
        fresh = engine.compress(CompressRequest(context=text, query=QUESTIONS[1], budget=64))
    finally:
        engine.documents = kept
    assert tokenized.count(True) == 3
    assert again.document_id == first.document_id == fresh.document_id
    assert comparable(again) == comparable(fresh)
