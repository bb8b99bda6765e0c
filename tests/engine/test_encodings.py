"""A request's encodings (engine/encodings.py), embedded model on its shallow calibration: what the encoding policy
plans for a request and where each encoding comes from: made once and kept in the document cache, read by the
document's later questions, and the deep encoding of a fallback taken on from the coarse one (layers 1..l_c not
run again), made once for all of a request's questions."""

from __future__ import annotations

import pytest

from ilre.compressor import pipeline
from ilre.contract.messages import CompressRequest
from ilre.engine.documents import DocumentCache
from tests.service.conftest import comparable
from tests.shallow import engine_on_shallow_calibration  # noqa: F401 (engine: a flow, on the shallow calibration)

from .test_documents import CANDIDATES, QUESTIONS, long_text

BUDGET = 200  # 800 candidates: well inside the ~2.8K-token document, so the cascade runs its candidate pass


@pytest.fixture
def counted(engine, monkeypatch):
    """The session engine on an empty document cache, counting the encodings made from the start (`steps`) and
    taken on from another (`resumed`)."""
    made = {"steps": 0, "resumed": 0}
    steps, resume = engine.encodings.steps, pipeline.resume_context

    def counted_steps(*args, **kwargs):
        made["steps"] += 1
        return steps(*args, **kwargs)

    def counted_resume(*args, **kwargs):
        made["resumed"] += 1
        return resume(*args, **kwargs)

    monkeypatch.setattr(engine.encodings, "steps", counted_steps)
    monkeypatch.setattr(pipeline, "resume_context", counted_resume)
    kept = engine.documents
    engine.documents = DocumentCache(1 << 30)
    try:
        yield made
    finally:
        engine.documents = kept


def uncached(engine, request: CompressRequest) -> dict:
    kept = engine.documents
    engine.documents = DocumentCache(0)
    try:
        return comparable(engine.compress(request))
    finally:
        engine.documents = kept


def test_a_documents_encoding_is_made_once_and_read_by_its_later_questions(engine, counted):
    first = engine.compress(CompressRequest(context=long_text(), query=QUESTIONS[0], budget=BUDGET,
                                            strategy_options=CANDIDATES))
    later = [engine.compress(CompressRequest(document_id=first.document_id, query=q, budget=BUDGET,
                                             strategy_options=CANDIDATES)) for q in QUESTIONS[1:]]
    assert counted == {"steps": 1, "resumed": 0}
    assert engine.documents.stats.hits["state", "local"] == len(later)
    for question, result in zip(QUESTIONS[1:], later):  # what a fresh encoding of the text selects
        assert result.kept_indices == uncached(engine, CompressRequest(context=long_text(), query=question, budget=BUDGET,
                                                                       strategy_options=CANDIDATES))["kept_indices"]


def test_a_fallback_takes_the_deep_encoding_on_from_the_coarse_one_once_for_all_questions(engine, counted):
    """Every question falls back (deepen_below 1): the policy plans the cascade, the coarse encoding keeps its resume
    point, the deep encoding is taken on from it once for the request's three questions and kept beside it (deepening
    off), and the first selection that read it carries what it took ("deepen")."""
    always = {"deepen_below": 1.0}
    job = engine.prepare(CompressRequest(context=long_text(), queries=QUESTIONS, budget=BUDGET, strategy_options=always))
    plan = engine.encodings.plan(job)
    assert plan.strategy == job.strategy and plan.encodings.keep_resume and plan.offer is None
    outcome = engine.compress(CompressRequest(context=long_text(), queries=QUESTIONS, budget=BUDGET,
                                              strategy_options=always))
    assert counted == {"steps": 1, "resumed": 1}
    assert all(r.fell_back for r in outcome.results)
    assert outcome.results[0].timings_ms["deepen"] > 0
    assert all("deepen" not in r.timings_ms for r in outcome.results[1:])
    (entry,) = engine.documents._docs.values()
    assert len(entry.states) == 2  # the coarse encoding and the deep one
    assert [r.kept_indices for r in outcome.results] == [
        uncached(engine, CompressRequest(context=long_text(), query=q, budget=BUDGET, strategy_options=always))["kept_indices"]
        for q in QUESTIONS]
