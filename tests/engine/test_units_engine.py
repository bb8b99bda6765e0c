"""Whole units through the engine (granularity "unit"): the same kept indices however the document is
reached, the budget met with whole units, bad input that degrades instead of failing."""

from __future__ import annotations

import json
import random

import pytest
import torch

from tests.selecting import select_context, select_context_queries
from ilre.compressor.units import document_units
from ilre.contract.messages import CompressRequest, InputError
from ilre.models.token_bytes import context_bytes, token_bytes

from .test_documents import CANDIDATES
from tests.shallow import engine_on_shallow_calibration  # noqa: F401 (engine: a flow, on the shallow calibration)


RECORDS = [{"id": f"{a}-{b}", "status": s, "latency_ms": 1000 + 37 * k}
           for k, (a, b, s) in enumerate(zip(["amber", "birch", "cedar", "delta", "ember"] * 40,
                                             ["fox", "gull", "heron", "ibis", "jay", "kite", "lark", "moth"] * 25,
                                             ["ok", "failed", "pending"] * 67))][:100]  # ~2.5K tokens
CONTEXT = "Below is the output of the list_jobs tool, one record per line.\n" + "\n".join(map(json.dumps, RECORDS))
QUERY = "Question: What is the latency_ms of the job whose id is cedar-kite? Answer:"
OTHER = "Question: Which jobs failed? Answer:"


def test_cached_multi_query_and_uncached_results_are_equal(engine):
    first = engine.compress(CompressRequest(context=CONTEXT, query=QUERY, budget=200, granularity="unit"))
    again = engine.compress(CompressRequest(document_id=first.document_id, query=QUERY, budget=200, granularity="unit"))
    many = engine.compress(CompressRequest(document_id=first.document_id, queries=[OTHER, QUERY], budget=200,
                                           granularity="unit"))
    engine.documents.clear()
    fresh = engine.compress(CompressRequest(context=CONTEXT, query=QUERY, budget=200, granularity="unit"))
    assert first.kept_indices == again.kept_indices == fresh.kept_indices
    assert first.granularity == "unit" and first.kept_spans == fresh.kept_spans
    # the engine's path is the pipeline's: the same request through select_context with the same units
    ids = torch.tensor(engine.tokenizer(CONTEXT, add_special_tokens=False).input_ids)
    query = torch.tensor(engine.tokenizer(QUERY, add_special_tokens=False).input_ids)
    units = document_units(context_bytes(token_bytes(engine.tokenizer), ids))
    job = engine.prepare(CompressRequest(context=CONTEXT, query=QUERY, budget=200, granularity="unit"), "")
    assert torch.equal(job.units.bounds, units.bounds) and job.units.heads is None is units.heads  # no table
    direct = select_context(job.model, ids, query, 200, job.strategy, job.prefill, units=units)
    assert direct.kept.tolist() == first.kept_indices
    # several questions of the cached document: the pipeline's answers to both (one shared candidate pass)
    other = torch.tensor(engine.tokenizer(OTHER, add_special_tokens=False).input_ids)
    both = select_context_queries(job.model, ids, [other, query], 200, job.strategy, job.prefill, units=units)
    assert [r.kept_indices for r in many.results] == [s.kept.tolist() for s in both]


def test_the_budget_is_met_with_whole_records(engine):
    result = engine.compress(CompressRequest(context=CONTEXT, query=QUERY, budget=200, granularity="unit",
                                             strategy="ilre", layer="fast"))
    assert result.compressed_tokens == 200 and result.kept_indices == sorted(set(result.kept_indices))
    spans = [CONTEXT[a:b] for a, b in result.kept_spans]
    records = [s for s in spans if s.startswith('{"id"')]
    whole = [s for s in records if s.rstrip("\n").endswith("}")]
    assert len(records) - len(whole) <= 1  # every kept record whole but at most one trimmed
    tokens = engine.compress(CompressRequest(context=CONTEXT, query=QUERY, budget=200, granularity="token",
                                             strategy="ilre", layer="fast"))
    assert tokens.granularity == "token" and "kept_spans" not in tokens.to_dict()


def test_a_kept_row_brings_its_table_header(stored_engine):
    """An 8K-token CSV export (the suite's records_csv): the asked row is kept whole with the header row,
    over 2K tokens before it; token selection keeps the row's numbers without their column names (the stored
    profile's selections: this test's point)."""
    engine = stored_engine
    from ilre.evaluation.tasks.ruler import generate_sample

    sample = generate_sample(engine.tokenizer, "records_csv", 8192, 0, 1)
    lines = sample.context.splitlines(keepends=True)
    header = next(line for line in lines if line.startswith("project,"))
    row = next(line for line in lines if sample.answers[0] in line)
    assert sample.context.index(row) - sample.context.index(header) > 5000  # over 2K tokens apart
    units = engine.compress(CompressRequest(context=sample.context, query=sample.query, budget=512, granularity="unit",
                                            strategy_options=CANDIDATES))
    spans = [sample.context[a:b] for a, b in units.kept_spans]
    assert units.compressed_tokens == 512 and header in spans and row in spans
    rows = [s for s in spans if s.count(",") == header.count(",") and s != header]
    assert len([s for s in rows if s.endswith("\n")]) >= len(rows) - 1  # rows whole but the trimmed one
    tokens = engine.compress(CompressRequest(context=sample.context, query=sample.query, budget=512, granularity="token",
                                             strategy_options=CANDIDATES))  # the candidates alone miss the header
    assert row in tokens.compressed_context and header not in tokens.compressed_context


def test_a_granularity_not_offered_is_refused_naming_the_field():
    with pytest.raises(InputError) as refused:
        CompressRequest(context="a b c", query="q", granularity="sentence")
    assert refused.value.field == "granularity" and "token, unit" in str(refused.value)


@pytest.mark.parametrize("kind", ["random bytes", "json 3000 deep", "mixed scripts"])
def test_inputs_without_structure_degrade_and_meet_the_budget(engine, kind):
    rng = random.Random(5)
    context = {"random bytes": bytes(rng.randrange(256) for _ in range(6000)).decode("utf-8", "replace"),
               "json 3000 deep": '{"a": [' * 1500 + "7" + "]}" * 1500,  # deeper than Python's recursion limit
               "mixed scripts": "".join(rng.choice(["東京は大きい。", " Привет, мир.", " مرحبا؟", " Hello there.", "\r\n",
                                                    " {\"k\": [1, 2", "]}", " e.g. 3.14 v2.0"]) for _ in range(700))}[kind]
    result = engine.compress(CompressRequest(context=context, query="What is here? Answer:", budget=256,
                                             granularity="unit", strategy="ilre", layer="fast"))
    assert result.compressed_tokens == 256 and len(set(result.kept_indices)) == 256


def test_a_request_without_granularity_gets_the_profiles(engine):
    import dataclasses

    request = CompressRequest(context=CONTEXT, query=QUERY, budget=120, strategy="ilre", layer="fast")
    result = engine.compress(request)
    assert result.granularity == "unit" and result.kept_spans  # the shipped profile names units (the evaluation's choice)
    assert engine.compress(dataclasses.replace(request, granularity="token")).granularity == "token"
    saved = engine.profile
    try:
        engine.profile = dataclasses.replace(saved, details={k: v for k, v in saved.details.items() if k != "granularity"})
        assert engine.compress(request).granularity == "token"  # a profile naming none: single tokens
    finally:
        engine.profile = saved
