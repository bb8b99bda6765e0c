"""Deepening: a document asked once is encoded in full to l_R while the engine is idle, and its later
queries are answered from that encoding. Checked against the strategy it stands for (plain ILRe at l_R
with the coarse layer blended in, computed from scratch), with requests coming first, resumed where it
stopped, across workers through a real redis-server, and the background thread's rules on its own."""

from __future__ import annotations

import contextlib
import time

import pytest

import torch

from ilre.compressor.context_state import chunk_bounds
from tests.selecting import select_query
from ilre.compressor.prefill import encode_context, encode_in_steps, run_steps
from ilre.compressor.prefill_config import PrefillConfig
from ilre.compressor import cascade_reading as cascade_module
from ilre.compressor.strategies import make_strategy
from ilre.contract.messages import CompressRequest
from ilre.engine.deepening import Deepener, DeepeningStats
from ilre.engine.documents import DocumentCache
from ilre.models.loader import load_truncated
from ilre.service.documents.redis_tier import RedisDocuments
from tests.reference import full_depth_options
from tests.tiny_models import N_LAYERS, random_ids, tiny_checkpoint

from tests.service.conftest import comparable
from .test_documents import CANDIDATES, QUESTIONS, long_text
from tests.shallow import engine_on_shallow_calibration  # noqa: F401 (engine: a flow, on the shallow calibration)


STREAMED = {**CANDIDATES, "first_from_stream": True}  # as a first question runs where the cache holds streams
BUDGET = 200  # 800 candidates: well inside the ~2.8K-token document, so the first query runs the candidate pass


@contextlib.contextmanager
def deepening_on(engine, shared=None):
    """The session engine with background deepening on (its counters from zero) and an empty document cache
    (on `shared` when given); off again, and idle, after."""
    kept, deepener = engine.documents, engine.deepening
    engine.documents = DocumentCache(1 << 30, shared)
    deepener.enabled, deepener.stats = True, DeepeningStats()
    try:
        yield engine
    finally:
        deepener.enabled = False
        deepener.wait_idle(300)
        engine.documents = kept


_FROM_SCRATCH: dict[tuple[int, str], dict] = {}  # (engine, request) -> its result: computed once per session


def uncached(engine, request: CompressRequest) -> dict:
    """The request's result from scratch (the session engine: no deepening, its cache off), computed once per
    request (float32: the same answer each time) and handed out as a copy."""
    key = (id(engine), repr(request))
    if key not in _FROM_SCRATCH:
        kept = engine.documents
        engine.documents = DocumentCache(0)
        try:
            _FROM_SCRATCH[key] = comparable(engine.compress(request))
        finally:
            engine.documents = kept
    return dict(_FROM_SCRATCH[key])


def full_depth_reference(engine, query: str, context: str | None = None) -> dict:
    """What a deepened document stands for, from scratch: plain ILRe at l_R with the cascade's coarse layer
    at its weight (the profile's), the strategy's name aside."""
    blended = full_depth_options(engine.profile)
    result = uncached(engine, CompressRequest(context=context or long_text(), query=query, budget=BUDGET,
                                              strategy="ilre", strategy_options=blended))
    return {k: v for k, v in result.items() if k not in ("strategy", "fell_back")}


def without_strategy(result) -> dict:
    return {k: v for k, v in comparable(result).items() if k not in ("strategy", "fell_back")}


def test_stepwise_encoding_interleaved_equals_encode_context():
    model = load_truncated(tiny_checkpoint("llama"), N_LAYERS)
    config = PrefillConfig(sink=2, window=5, chunk=7, dca=True)
    a_ids, b_ids = random_ids(45, seed=3), random_ids(30, seed=4)
    a, b = encode_in_steps(model, a_ids, config, (2, N_LAYERS)), encode_in_steps(model, b_ids, config)
    steps = 0
    for _ in b:  # another encoding's steps between each of a's: nothing is shared
        steps += 1
        next(a, None)
    state = run_steps(a)
    reference = encode_context(model, a_ids, config, (2, N_LAYERS))
    assert steps == len(chunk_bounds(30, config)) * (N_LAYERS - 1)  # one step per layer below l_R per chunk
    for layer in reference.keys:
        assert state.keys[layer].equal(reference.keys[layer])
    for got, want in zip(state.caches, reference.caches):
        assert got.k.equal(want.k) and got.v.equal(want.v) and got.sink_raw.equal(want.sink_raw)
    with pytest.raises(ValueError, match="parts: unknown"):  # checked when made, not at the first step
        encode_in_steps(model, a_ids, config, parts=("nonsense",))


def test_a_document_asked_again_is_answered_from_its_full_depth_encoding(engine):
    cascade = uncached(engine, CompressRequest(context=long_text(), query=QUESTIONS[1], budget=BUDGET,
                                              strategy_options=STREAMED))
    references = [full_depth_reference(engine, query) for query in QUESTIONS]
    with deepening_on(engine):
        first = engine.compress(CompressRequest(context=long_text(), query=QUESTIONS[1], budget=BUDGET,
                                              strategy_options=CANDIDATES))
        assert comparable(first) == cascade  # the first query: the cascade from the coarse stream, as without deepening
        assert engine.deepening.wait_idle(120) and engine.deepening.stats.finished == 1
        again = [engine.compress(CompressRequest(document_id=first.document_id, query=query, budget=BUDGET,
                                              strategy_options=CANDIDATES))
                 for query in QUESTIONS]
        by_text = engine.compress(CompressRequest(context=long_text(), query=QUESTIONS[0], budget=BUDGET,
                                              strategy_options=CANDIDATES))
        assert engine.deepening.wait_idle(10) and engine.deepening.stats.finished == 1  # not offered again
        (entry,) = engine.documents._docs.values()
        held = list(entry.states)
    assert [r.strategy for r in again] == ["cascade"] * 3
    assert [without_strategy(r) for r in again] == references
    assert without_strategy(by_text) == references[0]
    assert len(held) == 1 and held[0].startswith(f"l{engine.layer}-")  # the coarse layer's encoding was dropped


def test_requests_come_first_and_deepening_resumes_where_it_stopped(engine):
    short = long_text()[:6000]
    alone = uncached(engine, CompressRequest(context=short, query=QUESTIONS[2], budget=BUDGET,
                                              strategy_options=STREAMED))
    with deepening_on(engine):
        first = engine.compress(CompressRequest(context=long_text(), query=QUESTIONS[1], budget=BUDGET,
                                              strategy_options=CANDIDATES))
        stats = engine.deepening.stats
        deadline = time.monotonic() + 60
        while stats.steps < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        other = engine.compress(CompressRequest(context=short, query=QUESTIONS[2], budget=BUDGET,
                                              strategy_options=CANDIDATES))
        assert stats.steps >= 5 and stats.finished == 0  # the request ran in the middle of the deepening
        assert engine.deepening.wait_idle(120) and stats.finished == 2  # then both documents, each once
    assert comparable(other) == alone
    chunks = [len(chunk_bounds(r.original_tokens, engine.config.prefill)) for r in (first, other)]
    # every step ran once (resumed, not restarted), from the coarse layer's stream the document's encoding kept
    assert stats.steps == sum(n * (engine.layer - coarse_layer(engine)) + 1 for n in chunks)


def coarse_layer(engine) -> int:
    return engine.with_profile(make_strategy("cascade")).coarse_layer


def test_a_first_question_starts_its_candidates_from_its_own_stream_where_the_engine_holds_streams(engine, monkeypatch):
    """Streams held (`--deepen hold`, or deepening on): a document's first question runs its candidates on from the
    stream its coarse pass left, and selects what the pipeline selects on a fresh encoding with that stream. Without
    them (`--deepen off`) it runs them from layer 1 unless the request asks otherwise, so that cached and grown
    contexts select what fresh ones do."""
    started, real = [], cascade_module.candidate_prefill

    def spy(*args):
        started.append(args[5].layer if args[5] is not None else 1)
        return real(*args)

    monkeypatch.setattr(cascade_module, "candidate_prefill", spy)
    asked = CompressRequest(context=long_text(), query=QUESTIONS[1], budget=BUDGET, strategy_options=CANDIDATES)
    held = compressed_fresh(engine, asked)  # the session engine: deepening off, no streams held
    explicit = compressed_fresh(engine, CompressRequest(context=long_text(), query=QUESTIONS[1], budget=BUDGET,
                                                        strategy_options=STREAMED))
    streamed = compressed_fresh(engine, asked, hold_streams=True)
    coarse = coarse_layer(engine)
    assert started == [1, coarse, coarse]
    assert streamed["kept_indices"] == explicit["kept_indices"] == kept_from_stream(engine, asked)
    assert held["kept_indices"] == kept_from_layer_one(engine, asked)


def compressed_fresh(engine, request: CompressRequest, hold_streams: bool = False) -> dict:
    """The request's result on the session engine with an empty document cache, streams held or not."""
    kept = engine.documents
    engine.documents, engine.encodings.hold_streams = DocumentCache(0), hold_streams
    try:
        return comparable(engine.compress(request))
    finally:
        engine.documents, engine.encodings.hold_streams = kept, False


def kept_from_layer_one(engine, request: CompressRequest) -> list[int]:
    """What the pipeline keeps for `request` with its candidates run from layer 1 (no stream handed on)."""
    job = engine.prepare(request)
    with torch.inference_mode():
        state = encode_context(job.model, job.context_ids, job.prefill, job.strategy.reading().encoded_layers(job.layer))
    return select_query(job.model, state, job.queries[0], job.budget, job.strategy, context_ids=job.context_ids,
                        units=job.units).kept.tolist()


def test_a_question_before_deepening_ends_starts_its_candidates_from_the_kept_stream(engine, monkeypatch):
    """While a document waits for deepening its encoding keeps the stream entering the coarse layer (counted in the
    cache), and its later questions, by id or by text, start their candidates there: equal to the pipeline's
    selection on an encoding that kept its stream, each reading the rows of the candidates the question before it
    ran (compressor/candidate_rows.py, counted in the cache too). The first question starts there too, as it does
    without deepening."""
    started, real = [], cascade_module.candidate_prefill

    def spy(*args):
        started.append(args[5].layer if args[5] is not None else 1)
        return real(*args)

    monkeypatch.setattr(cascade_module, "candidate_prefill", spy)
    asked = [CompressRequest(context=long_text(), query=QUESTIONS[1], budget=BUDGET, strategy_options=CANDIDATES)]
    with deepening_on(engine):
        with engine.deepening.paused():
            first = engine.compress(asked[0])
            asked += [CompressRequest(document_id=first.document_id, query=QUESTIONS[0], budget=BUDGET,
                                      strategy_options=CANDIDATES),
                      CompressRequest(context=long_text(), query=QUESTIONS[2], budget=BUDGET,
                                      strategy_options=CANDIDATES)]
            later = [engine.compress(request) for request in asked[1:]]
            (entry,) = engine.documents._docs.values()
            (held,) = entry.states.values()
            stream, rows, held.hidden, held.rows = held.hidden, held.rows, None, None
            bare, held.hidden, held.rows = held.nbytes, stream, rows
            assert stream is not None and rows.rows is not None and rows.reused > 0
            assert held.nbytes == bare + stream.numel() * stream.element_size() + rows.nbytes  # counted
            assert engine.documents.stats.bytes == entry.nbytes
            assert engine.deepening.stats.steps == 0
        assert engine.deepening.wait_idle(120) and engine.deepening.stats.finished == 1
        (deep,) = entry.states.values()
        assert deep.hidden is None  # the deep encoding replaced the coarse one and its stream
    coarse = coarse_layer(engine)
    assert started == [coarse, coarse, coarse]
    assert comparable(first) == uncached(engine, CompressRequest(context=long_text(), query=QUESTIONS[1], budget=BUDGET,
                                                                  strategy_options=STREAMED))
    by_text = [CompressRequest(context=long_text(), query=request.query, budget=BUDGET, strategy_options=CANDIDATES)
               for request in asked]
    for i, result in enumerate(later, 1):
        assert result.kept_indices == kept_from_stream(engine, by_text[i], by_text[:i]) and not result.fell_back


def kept_from_stream(engine, request: CompressRequest, before: list[CompressRequest] | tuple = ()) -> list[int]:
    """What the pipeline keeps for `request` on its context encoded whole with its stream, the candidates started
    there: the path a question asked before deepening ends stands for. `before`: the questions asked earlier of the
    same encoding (each from the stream), whose candidates' rows it reads."""
    job = engine.prepare(request)
    with torch.inference_mode():
        state = encode_context(job.model, job.context_ids, job.prefill, job.strategy.reading().encoded_layers(job.layer),
                               keep_hidden=True)
        for i, earlier in enumerate(before):
            asked = engine.prepare(earlier)
            select_query(job.model, state, asked.queries[0], asked.budget, asked.strategy, context_ids=job.context_ids,
                         units=job.units, stream=state.hidden)
    return select_query(job.model, state, job.queries[0], job.budget, job.strategy, context_ids=job.context_ids,
                        units=job.units, stream=state.hidden).kept.tolist()


def test_a_deepened_document_serves_another_worker_through_redis(engine, redis_server):
    reference = full_depth_reference(engine, QUESTIONS[0])
    shared = RedisDocuments(redis_server.url, prefix="docs-deep", max_bytes=1 << 30, ttl_s=60)
    try:
        with deepening_on(engine, shared):
            first = engine.compress(CompressRequest(context=long_text(), query=QUESTIONS[1], budget=BUDGET,
                                              strategy_options=CANDIDATES))
            assert engine.deepening.wait_idle(120) and engine.deepening.stats.finished == 1
        with deepening_on(engine, shared):  # another worker: its own empty process tier, the same Redis
            again = engine.compress(CompressRequest(document_id=first.document_id, query=QUESTIONS[0], budget=BUDGET,
                                              strategy_options=CANDIDATES))
            assert engine.deepening.wait_idle(10) and engine.deepening.stats.steps == 0  # nothing left to deepen
            assert engine.documents.stats.hits["state", "shared"] == 1
    finally:
        shared.close()
    assert without_strategy(again) == reference


def test_a_query_the_candidates_miss_deepens_the_document_at_once(engine):
    """A first query whose candidates l_R attends to weakly (here: any, `deepen_below` 1) is answered from
    the full-depth encoding, which the document then keeps: nothing is left to deepen in the background,
    and a later query reads it (no second encoding). Below the threshold nothing changes."""
    always = {"deepen_below": 1.0}
    reference = full_depth_reference(engine, QUESTIONS[1])
    candidates_only = uncached(engine, CompressRequest(context=long_text(), query=QUESTIONS[1], budget=BUDGET,
                                                       strategy_options=CANDIDATES))
    assert {k: v for k, v in candidates_only.items() if k != "strategy"} != reference
    with deepening_on(engine):
        first = engine.compress(CompressRequest(context=long_text(), query=QUESTIONS[1], budget=BUDGET,
                                                strategy_options=always))
        assert engine.deepening.wait_idle(120) and engine.deepening.stats.steps == 0  # nothing left to deepen
        again = engine.compress(CompressRequest(document_id=first.document_id, query=QUESTIONS[0], budget=BUDGET,
                                                strategy_options=always))
        (entry,) = engine.documents._docs.values()
        held = list(entry.states)
    assert without_strategy(first) == reference and first.strategy == "cascade"
    assert first.timings_ms["deepen"] > 100 * again.timings_ms.get("deepen", 0.0)  # encoded once, then read
    assert without_strategy(again) == full_depth_reference(engine, QUESTIONS[0])
    assert len(held) == 1 and held[0].startswith(f"l{engine.layer}-")  # the coarse layer's encoding was dropped
    assert "deepen" not in engine.compress(CompressRequest(context=long_text(), query=QUESTIONS[1], budget=BUDGET,
                                                           strategy_options=CANDIDATES)).timings_ms


def test_with_deepening_off_a_fallen_back_document_keeps_both_encodings(engine):
    """Deepening off (the library's and the CLI's default): every query runs the cascade, so the document
    keeps layer 8's encoding beside the full-depth one its first fallback left, and neither is encoded twice."""
    always = {"deepen_below": 1.0}
    kept = engine.documents
    engine.documents = DocumentCache(1 << 30)
    try:
        first = engine.compress(CompressRequest(context=long_text(), query=QUESTIONS[1], budget=BUDGET,
                                                strategy_options=always))
        again = engine.compress(CompressRequest(document_id=first.document_id, query=QUESTIONS[0], budget=BUDGET,
                                                strategy_options=always))
        (entry,) = engine.documents._docs.values()
        held, stats = sorted(entry.states), engine.documents.stats
    finally:
        engine.documents = kept
    assert without_strategy(first) == full_depth_reference(engine, QUESTIONS[1])
    assert without_strategy(again) == full_depth_reference(engine, QUESTIONS[0])
    assert len(held) == 2  # layer 8's encoding and the full-depth one, each encoded once:
    assert stats.misses["state", "local"] == 2 and stats.hits["state", "local"] == 2  # looked up by both queries
    assert first.timings_ms["deepen"] > 100 * again.timings_ms["deepen"]


ASKED = [*QUESTIONS, " Question: who waits at the gate? Answer:"]


def test_a_request_with_many_questions_shares_one_candidate_pass_or_reads_the_context_to_l_r_once(engine, monkeypatch):
    """Three questions with 800 candidates each over ~2.8K tokens share one candidate pass (the union of their
    candidates costs less than reading the whole context on from the coarse layer: 19 x |U| < 11 x L; each
    question is ranked over the union, checked exactly in tests/compressor/test_shared_candidates.py). With
    2,000 candidates each the union costs more, so the request reads the context once, resumed from the
    coarse encoding, and every question is answered as a deepened document answers it, `fell_back` set."""
    import ilre.compressor.pipeline as pipeline
    import ilre.compressor.cascade_reading as cascade_module

    resumes, passes = [], []
    real_resume, real_pass = pipeline.resume_context, cascade_module.candidate_prefill_many
    monkeypatch.setattr(pipeline, "resume_context", lambda *a, **k: resumes.append(1) or real_resume(*a, **k))
    monkeypatch.setattr(cascade_module, "candidate_prefill_many", lambda *a, **k: passes.append(1) or real_pass(*a, **k))
    kept = engine.documents
    engine.documents = DocumentCache(1 << 30)
    try:
        few = engine.compress(CompressRequest(context=long_text() + " ", queries=ASKED[:3], budget=BUDGET))
        assert passes == [1] and resumes == [] and not any(r.fell_back for r in few.results)
        assert "deepen" not in few.results[0].timings_ms
        engine.documents = DocumentCache(1 << 30)  # not the first context's (which this one's prefill would take on)
        many = engine.compress(CompressRequest(context=long_text(), queries=ASKED, budget=BUDGET,
                                               strategy_options={"candidates": 10}))
    finally:
        engine.documents = kept
    assert passes == [1] and resumes == [1]  # no candidate pass; layers 1..8 ran once, for the coarse encoding
    for question, result in zip(ASKED, many.results):
        assert without_strategy(result) == full_depth_reference(engine, question) and result.strategy == "cascade"
        assert result.fell_back
    assert "deepen" in many.results[0].timings_ms and all("deepen" not in r.timings_ms for r in many.results[1:])
    assert len({tuple(r.kept_indices) for r in few.results}) > 1  # the shared pass still answers each question apart


# --- the background thread's rules, on plain generators ----------------------------------------

def counting(log: list, name: str, steps: int):
    def run():
        for i in range(steps):
            log.append((name, i))
            yield
        return name
    return run


def test_no_step_runs_while_a_request_holds_its_turn_and_newest_offers_go_first():
    deepener, log, stored = Deepener(True), [], []
    try:
        with deepener.turn():
            with deepener._changed:  # both offered before the thread takes one
                for name in ("old", "new"):
                    deepener.offer(name, counting(log, name, 3), stored.append, lambda: True)
            time.sleep(0.2)
            assert log == [] and deepener.pending("old")  # "new" is taken, waiting for its turn
        assert deepener.wait_idle(10)
        assert stored == ["new", "old"] and [n for n, _ in log] == ["new"] * 3 + ["old"] * 3
        assert deepener.stats.finished == 2 and deepener.stats.steps == 8
    finally:
        deepener.close()


def test_a_document_that_left_the_cache_is_skipped_and_the_queue_is_bounded():
    deepener, log, stored = Deepener(True, max_pending=2), [], []
    try:
        with deepener.turn(), deepener._changed:  # the thread takes nothing until all four are offered
            deepener.offer("gone", counting(log, "gone", 3), stored.append, lambda: False)
            for name in ("a", "b", "c"):  # "gone" and then "a" fall off the end
                deepener.offer(name, counting(log, name, 1), stored.append, lambda: True)
        assert deepener.wait_idle(10)
        assert stored == ["c", "b"] and deepener.stats.dropped == 2
    finally:
        deepener.close()


def timed(log: list, name: str, steps: int, step_s: float):
    """A document whose deepening takes `steps` steps of `step_s` seconds each (a stub of a step's cost)."""
    def run():
        for _ in range(steps):
            time.sleep(step_s)
            yield
        log.append((name, time.monotonic()))
        return name
    return run


def test_keys_take_turns_so_a_flooding_key_delays_another_by_one_document_at_most():
    """One key offers 20 documents, each 5 steps of 20 ms (0.1 s); a quiet key's document offered while the
    flooder's first runs is done within two documents' time, and the flooder's then go on, newest first."""
    deepener, done, stored = Deepener(True, max_pending=8), [], []
    try:
        with deepener.turn(), deepener._changed:
            for n in range(20):
                deepener.offer(f"flood-{n}", timed(done, f"flood-{n}", 5, 0.02), stored.append, lambda: True,
                               owner="flood")
        time.sleep(0.03)  # the flooder's newest is being deepened
        offered = time.monotonic()
        deepener.offer("quiet", timed(done, "quiet", 5, 0.02), stored.append, lambda: True, owner="quiet")
        assert deepener.wait_idle(30)
    finally:
        deepener.close()
    order = [name for name, _ in done]
    assert order[:2] == ["flood-19", "quiet"], order  # the one in progress, then the quiet key's
    assert dict(done)["quiet"] - offered < 2 * 0.1 + 0.15  # two documents' time (and scheduling slack)
    assert order[2:] == [f"flood-{n}" for n in range(18, 11, -1)]  # 8 kept per key (the newest), newest first
    assert deepener.stats.dropped == 12


def test_keys_with_documents_waiting_are_served_round_robin_and_the_total_is_bounded(monkeypatch):
    import ilre.engine.deepening as deepening

    monkeypatch.setattr(deepening, "MAX_WAITING", 6)
    deepener, log, stored = Deepener(True, max_pending=4), [], []
    try:
        with deepener.turn(), deepener._changed:
            for owner, count in (("a", 4), ("b", 2), ("c", 1)):
                for n in range(count):
                    deepener.offer(f"{owner}{n}", counting(log, f"{owner}{n}", 1), stored.append, lambda: True,
                                   owner=owner)
        assert deepener.wait_idle(10)
    finally:
        deepener.close()
    # 7 offered, 6 kept: the oldest of the owner with the most ("a0") went; then turns: the newest owner first
    assert stored == ["c0", "b1", "a3", "b0", "a2", "a1"] and deepener.stats.dropped == 1


def test_a_failing_deepening_is_logged_and_the_next_one_runs(caplog):
    def broken():
        yield
        raise RuntimeError("out of memory")

    deepener, stored = Deepener(True), []
    try:
        with deepener.turn():
            deepener.offer("ok", counting([], "ok", 2), stored.append, lambda: True)
            deepener.offer("broken", broken, stored.append, lambda: True)
        assert deepener.wait_idle(10)
    finally:
        deepener.close()
    assert stored == ["ok"] and deepener.stats.dropped == 1
    assert "deepening a document failed" in caplog.text


def test_off_starts_no_thread_and_close_stops_a_long_one():
    off = Deepener(False)
    off.offer("x", counting([], "x", 1), lambda state: None, lambda: True)
    assert off.wait_idle(0) and off._thread is None and off.stats.steps == 0
    on, log = Deepener(True), []
    on.offer("long", counting(log, "long", 10**9), lambda state: None, lambda: True)
    time.sleep(0.1)
    on.close()
    steps = len(log)
    time.sleep(0.1)
    assert 0 < steps == len(log)


EXIT_WHILE_DEEPENING = """
import sys, time, torch
from ilre.engine import deepening
if sys.argv[1] == "unregistered":
    import atexit; atexit.unregister(deepening._close_all)
def work():
    a = torch.randn(256, 256)
    while True:
        for _ in range(50):
            a = torch.tanh(a @ a)
        yield
d = deepening.Deepener(True)
d.offer("forever", work, lambda state: None, lambda: True)
deadline = time.monotonic() + 30  # until it has started (a loaded machine starts it late), then exit at once
while d.stats.steps == 0 and time.monotonic() < deadline:
    time.sleep(0.05)
print("steps", d.stats.steps, flush=True)
"""


def test_a_process_exits_cleanly_while_a_document_is_being_deepened():
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", EXIT_WHILE_DEEPENING, "registered"], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0 and "terminate" not in run.stderr, run.stderr[-2000:]
    assert int(run.stdout.split()[-1]) > 0  # it was deepening when the interpreter went down
