"""The last stage of a request: Selections -> the contract's CompressResults (ids, text, spans, timings,
the explanation page)."""

from __future__ import annotations

import time

from ..compressor.pipeline import Selection
from ..compressor.units import kept_spans
from ..contract.messages import CompressResult, CompressResults
from ..models.token_bytes import context_bytes, token_bytes
from .explain import ExplanationFacts, render_explanation
from .prepared import Prepared


def results_of_job(tokenizer, model_name: str, sink: int, job: Prepared, selections: list[Selection]) -> CompressResults:
    """One CompressResult per query of `job` from its selections (kept indices -> ids, text, timings),
    as a list however many queries the request sent (`single` says whether it sent one)."""
    results = [_result(tokenizer, model_name, sink, job, i, selection) for i, selection in enumerate(selections)]
    return CompressResults(job.request.id, job.document_id, results, single=not job.request.multi)


def _result(tokenizer, model_name: str, sink: int, job: Prepared, index: int, selection: Selection) -> CompressResult:
    request, context_ids, query_ids = job.request, job.context_ids, job.queries[index]
    kept = selection.kept.tolist()
    kept_ids = context_ids[selection.kept].tolist()
    query_list = query_ids.tolist()
    selected = time.perf_counter()
    compressed = tokenizer.decode(kept_ids)
    text = request.query_inputs()[index][0]
    query = text if text is not None else tokenizer.decode(query_list)
    timings = {"tokenize": job.tokenize_ms, **selection.timings_ms, "detokenize": _ms(selected, time.perf_counter())}
    timings["total"] = _ms(job.started, time.perf_counter())
    result = CompressResult(
        id=request.id, token_ids=kept_ids + query_list, kept_indices=kept, compressed_context=compressed,
        query=query, original_tokens=len(context_ids), compressed_tokens=len(kept),
        ratio=round(len(kept) / len(context_ids), 6), model=model_name, layer=job.layer,
        strategy=job.strategy.name, dca=job.dca, passthrough=selection.passthrough, timings_ms=timings,
        document_id=job.document_id, budget=job.budget if selection.passthrough else len(kept),
        granularity=job.granularity, fell_back=bool(selection.measured.get("deep")),
        resumed_tokens=int(selection.measured.get("resumed_tokens", 0)),
    )
    if job.units is not None and not selection.passthrough:
        result.kept_spans = kept_spans(job.units.bounds, selection.kept, context_bytes(token_bytes(tokenizer), context_ids))
    if request.explain:
        result.explanation = _explanation(tokenizer, sink, job, selection, result)
    return result


def _explanation(tokenizer, sink: int, job: Prepared, selection: Selection, result: CompressResult) -> str:
    """The HTML page of one result (engine/explain.py)."""
    tokens = tokenizer.batch_decode([[i] for i in job.context_ids.tolist()])
    budget = result.budget or job.budget  # an automatic budget: the one chosen
    allocated = budget - min(sink, budget)
    facts = ExplanationFacts(model=result.model, layer=result.layer, strategy=result.strategy, dca=result.dca,
                             budget=budget, sink=sink, budget_split=job.strategy.budget_split(allocated),
                             query=result.query, timings_ms=result.timings_ms, passthrough=result.passthrough,
                             granularity=job.granularity)
    units = job.units.bounds.tolist() if job.units is not None else None
    return render_explanation(tokens, selection.scores, result.kept_indices, facts, units)


def _ms(a: float, b: float) -> float:
    return round((b - a) * 1000.0, 3)
