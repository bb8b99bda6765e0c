"""One question asked of several documents in one request (`document_ids`: a conversation's messages): one result
per document, each document cached as its keys alone (in process and on the Redis tier, in float32 and bfloat16),
read from the cache exactly as encoded now, and every bad field named."""

from __future__ import annotations

import dataclasses

import sysconfig
from pathlib import Path

import pytest

from ilre.contract.messages import CompressRequest, InputError, NotFoundError
from ilre.engine.documents import DocumentCache
from ilre.engine.engine import Engine, EngineConfig
from ilre.service.documents.redis_tier import RedisDocuments, charged

STDLIB = Path(sysconfig.get_paths()["stdlib"])
FILES = ("json/decoder.py", "textwrap.py", "shlex.py")
FACT = "AUDIT: the audit code of this file is ZEBRA-4417."
QUESTION = "Question: what is the audit code of the file? Answer:"
TOKENS = 1100  # a tool result's size in an agent's history


def messages(engine: Engine) -> list[str]:
    """~TOKENS-token slices of real files, the first with FACT planted at a third of it."""
    texts = []
    for name in FILES:
        ids = engine.tokenizer((STDLIB / name).read_text()).input_ids[:TOKENS]
        texts.append(engine.tokenizer.decode(ids))
    cut = texts[0].index("\n", len(texts[0]) // 3)
    texts[0] = f"{texts[0][:cut]}\n{FACT}{texts[0][cut:]}"
    return texts


def remembered(engine: Engine, texts: list[str]) -> list[str]:
    """Each text counted and cached whole (as a conversation's messages are first): their document ids."""
    return [engine.compress(CompressRequest(context=t, query=".", ratio=1.0)).document_id for t in texts]


ENGINES: dict[str, Engine] = {}


def engine_in(dtype: str) -> Engine:
    """An engine that deepens (the service's default), so a message is read in its deepened form; one per dtype."""
    if dtype not in ENGINES:
        ENGINES[dtype] = Engine(EngineConfig(dtype=dtype, deepen=True))
    return ENGINES[dtype]


@pytest.fixture(scope="module")
def deepening_engine():
    yield engine_in("float32")
    for engine in ENGINES.values():
        engine.close()


def asked(engine: Engine, docs: list[str], **fields):
    return engine.compress(CompressRequest(document_ids=docs, query=QUESTION, granularity="unit", **fields))


def test_one_question_of_several_documents(deepening_engine):
    engine = deepening_engine
    engine.documents = DocumentCache(1 << 30)
    texts = messages(engine) + ["A short note."]
    docs = remembered(engine, texts)
    out = asked(engine, docs, budgets=[140, 120, 120, 50], id="step-3")
    assert [r.document_id for r in out.results] == docs and out.to_dict()["results"][0]["id"] == "step-3"
    assert out.to_dict().keys() == {"id", "document_id", "results"}
    first, *_, short = out.results
    assert FACT in first.compressed_context  # the fact reaches the prompt
    assert all(r.compressed_tokens <= b for r, b in zip(out.results, [140, 120, 120]))
    assert all(r.query == QUESTION and not r.passthrough and r.kept_spans for r in out.results[:3])
    assert short.passthrough and short.compressed_context == texts[-1]
    again = asked(engine, docs, budgets=[140, 120, 120, 50])  # read from the cache: the same
    assert [r.kept_indices for r in again.results] == [r.kept_indices for r in out.results]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_message_is_cached_as_its_keys(deepening_engine, redis_server, dtype):
    """A deepened ~1,100-token message costs at most 1.5x its keys at the score layers plus 0.5 MiB, by the cache's
    own count and on the Redis tier; the same selections come back from either tier."""
    engine = engine_in(dtype)
    store = RedisDocuments(redis_server.url, prefix=f"shared-q-{engine.placement.dtype_name}", max_bytes=1 << 30,
                           ttl_s=3600)  # outlives the test: emulated bfloat16 under a loaded suite runs past a minute
    try:
        cache = engine.documents = DocumentCache(1 << 30, store)
        texts = messages(engine)
        docs = remembered(engine, texts)
        first = asked(engine, docs, ratio=0.12)
        end = cache._docs[engine.names.slot("", docs[-1])]
        assert end.part_bytes()["windows"] > 0  # the conversation's end keeps its windows (and resume point) for now
        later = remembered(engine, [texts[0][::-1]])  # the next step's message: a new end
        asked(engine, docs + later, ratio=0.12)
        spec = engine.spec
        for doc, result in zip(docs, first.results):
            entry = cache._docs[engine.names.slot("", doc)]
            (state,) = entry.states.values()
            keys = len(state.keys) * spec.num_kv_heads * spec.head_dim * result.original_tokens * state.keys[19].element_size()
            assert sorted(state.keys) == [8, 19] and entry.part_bytes()["keys"] == keys
            assert entry.nbytes <= 1.5 * keys + (1 << 19), (entry.part_bytes(), keys)
            slot = engine.names.slot("", doc)
            sizes = {k.decode() if isinstance(k, bytes) else k: int(v)
                     for k, v in redis_server.client().hgetall(store.sizes).items()}
            shared = sum(size for name, size in sizes.items() if slot in name)
            assert shared <= 1.5 * keys + (1 << 19), (shared, keys)
        parts = cache.part_bytes()
        last = cache._docs[engine.names.slot("", later[0])].part_bytes()
        assert sum(parts.values()) == cache.stats.bytes and parts["stream"] == 0
        assert parts["windows"] == last["windows"] and parts["resume"] == last["resume"]  # the live end's alone
        engine.documents = DocumentCache(1 << 30, store)  # another process: its keys read from Redis
        again = asked(engine, docs, ratio=0.12)
        assert engine.documents.stats.hits["state", "shared"] == len(docs)
    finally:
        store.close()
    assert [r.kept_indices for r in again.results] == [r.kept_indices for r in first.results]


def test_a_lone_question_of_a_message_cached_as_its_keys_encodes_it_again(deepening_engine):
    """Without its window caches a document asked alone (a retrieve, a question by its id) is encoded again and read
    as a deepened document is: the same answer as the deepened form's on a fresh cache (ILRe at l_R with the coarse
    layer blended)."""
    engine = deepening_engine
    engine.documents = DocumentCache(1 << 30)
    docs = remembered(engine, messages(engine))
    asked(engine, docs, ratio=0.12)
    lone = engine.compress(CompressRequest(document_id=docs[0], query=QUESTION, ratio=0.12, granularity="unit"))
    engine.documents = DocumentCache(1 << 30)
    remembered(engine, messages(engine))
    coarse = engine.profile.strategy_options("cascade")["coarse_layer"]
    deep = engine.compress(CompressRequest(document_id=docs[0], query=QUESTION, ratio=0.12, granularity="unit",
                                           strategy="ilre", strategy_options={"also_layers": [coarse]}))
    assert lone.kept_indices == deep.kept_indices and FACT in lone.compressed_context


def test_bad_document_requests_name_the_field(engine):
    docs = remembered(engine, ["One message, long enough to be a document of its own here.", "Another one."])
    with pytest.raises(NotFoundError) as err:
        engine.compress(CompressRequest(document_ids=[docs[0], "0" * 32], query=QUESTION))
    assert err.value.field == "document_ids[1]"
    cases = [({"document_ids": docs, "budgets": [5]}, "budgets", "must be a list of 2 budgets"),
             ({"document_ids": docs, "budgets": [5, 0]}, "budgets[1]", "must be a positive integer"),
             ({"document_ids": docs, "budgets": [5, 5], "ratio": 0.5}, "budgets", "either budgets or ratio"),
             ({"document_ids": docs, "context": "x"}, "context", "give document_ids alone"),
             ({"document_ids": docs, "budget": 5}, "budget", "give document_ids alone"),
             ({"document_ids": ["nope"]}, "document_ids[0]", "hex digits"),
             ({"document_ids": []}, "document_ids", "non-empty list"),
             ({"document_ids": docs[:1] * 1025}, "document_ids", "limit of 1024"),
             ({"document_ids": [docs[0], docs[1], docs[0]]}, "document_ids[2]", "of document_ids\\[0\\] again"),
             ({"document_ids": [docs[0], docs[0][:24]]}, "document_ids[1]", "again"),  # its short form too
             ({"budgets": [5]}, "budgets", "goes with document_ids")]
    for fields, name, words in cases:
        with pytest.raises(InputError, match=words) as err:
            CompressRequest.from_json({"query": QUESTION, **fields})
        assert err.value.field == name
    request = CompressRequest.from_json({"document_ids": docs, "budgets": [5, 6], "query": "q"}, {"ratio": 0.1})
    assert request.budgets == [5, 6] and request.ratio is None  # budgets replace a default ratio (a server's --ratio)
    with pytest.raises(InputError) as err:
        CompressRequest(document_ids=docs, queries=["a", "b"])
    assert err.value.field == "queries"


def test_the_tokens_one_request_names_are_capped_before_any_is_computed(engine, monkeypatch):
    """max_request_tokens bounds a document_ids request's work: over it the request is refused naming the setting
    while nothing has run (no prefill, no state computed), within it the same documents are answered."""
    text = " ".join(f"Line {i} of a message long enough to count." for i in range(40))
    docs = remembered(engine, [text + " A", text + " B", text + " C"])
    tokens = [engine.documents.ids(engine.names.slot("", d)).numel() for d in docs]
    monkeypatch.setattr(engine, "config", dataclasses.replace(engine.config, max_request_tokens=sum(tokens) - 1))
    states = lambda: {k: n for k, n in engine.documents.stats.misses.items() if k[0] == "state"}  # noqa: E731
    misses = states()
    with pytest.raises(InputError, match=r"the first 3 documents hold \d+ tokens, over the limit of \d+ one request "
                                         r"may name \(max_request_tokens\)") as err:
        engine.compress(CompressRequest(document_ids=docs, query=QUESTION, budgets=[8, 8, 8]))
    assert err.value.field == "document_ids" and states() == misses  # no state was looked for: none computed
    monkeypatch.setattr(engine, "config", dataclasses.replace(engine.config, max_request_tokens=sum(tokens)))
    assert len(engine.compress(CompressRequest(document_ids=docs, query=QUESTION, budgets=[8, 8, 8])).results) == 3


def redis_names(redis_server, store: RedisDocuments, slot: str) -> list[str]:
    """The shared tier's entries of the document in `slot`, by name."""
    names = [k.decode() if isinstance(k, bytes) else k for k in redis_server.client().hgetall(store.sizes)]
    return sorted(name.partition(slot)[2] for name in names if slot in name)


@pytest.mark.parametrize("background", [False, True], ids=["taken-deeper-here", "deepened-while-idle"])
def test_an_agents_first_steps_cost_what_nothing_cached_does(deepening_engine, redis_server, background):
    """Step 1 (one new message) is asked as a lone request by its id is: the strategy itself, as with nothing cached,
    not its deeper form. Step 2 asks that message as a later lone question of it is asked, from its own encoding (the
    cascade's candidates from its kept stream). Step 3 takes it deeper from its
    kept stream (or reads what deepening made while idle) and keeps its keys alone, in both tiers: every selection
    equal to the one made from the message's IDs on a fresh cache."""
    engine, texts = deepening_engine, messages(engine_in("float32"))
    store = RedisDocuments(redis_server.url, prefix=f"first-steps-{background}", max_bytes=1 << 30, ttl_s=3600)
    fields = {"query": QUESTION, "budget": 130, "granularity": "unit"}
    try:
        engine.documents = DocumentCache(1 << 30)
        docs = remembered(engine, texts)
        with engine.deepening.paused():
            lone = [engine.compress(CompressRequest(document_id=docs[0], **fields)) for _ in range(2)]  # first, later
        engine.documents = cache = DocumentCache(1 << 30, store)
        remembered(engine, texts)
        slot = engine.names.slot("", docs[0])
        with engine.deepening.paused():
            step1 = asked(engine, docs[:1], budgets=[130])
            (first,) = cache._docs[slot].states.values()
            assert sorted(first.keys) == [8] and first.hidden is not None  # the cascade's own, its stream kept
            steps = [asked(engine, docs[:2], budgets=[130, 130])]
            assert cache._docs[slot].states == {next(iter(cache._docs[slot].states)): first}  # read alone again
        if background:
            assert engine.deepening.wait_idle(60)
            (deep,) = cache._docs[slot].states.values()
            assert deep.has_windows and sorted(deep.keys) == [8, 19]
        with engine.deepening.paused():
            steps.append(asked(engine, docs, budgets=[130] * 3))
        (key, kept), = cache._docs[slot].states.items()
        assert key.endswith("-keysonly") and sorted(kept.keys) == [8, 19] and not kept.has_windows
        shared = redis_names(redis_server, store, slot)
        assert [n for n in shared if ":state:l" in n] == [n for n in shared if n.endswith("-keysonly")] != [], shared
        engine.documents = DocumentCache(1 << 30)
        remembered(engine, texts)
        with engine.deepening.paused():
            fresh = asked(engine, docs, budgets=[130] * 3)
    finally:
        store.close()
    assert [step1.results[0].kept_indices, steps[0].results[0].kept_indices] == [r.kept_indices for r in lone]
    assert [r.kept_indices for r in steps[1].results] == [r.kept_indices for r in fresh.results]
    assert FACT in steps[1].results[0].compressed_context
