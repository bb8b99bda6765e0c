"""A request that asks one question of several documents sent earlier (`document_ids`: a conversation's messages,
in order), one result per document.

Each document is prepared as a request of its own (its budget, units and strategy as a lone request by its id would
have them), then the documents the question can be moved to (compressor/shared_query.py: a strategy that scores the
query's states against the keys, in the form it takes on a document encoded in full where deepening is on) are read
together: each one's keys (EncodingPolicy.keys_state: from the cache, else encoded now and kept keys only), one
pass of the question after the last of them, moved to each. The others (strategies that read more, such as values
or a trained head) are asked one by one as lone requests, and so are the documents that cost less asked alone
this time (`_alone_now`: an agent's first step, as with nothing cached). A document that fits its budget passes
through.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Protocol

import torch

from ..compressor.pipeline import Selection
from ..compressor.prefill import prefill_query
from ..compressor.shared_query import SharedQuestionJob, select_shared
from ..compressor.strategies import Strategy
from ..contract.messages import CompressRequest, CompressResults, InputError, NotFoundError
from .deepening import Deepener
from .encodings import EncodingPolicy
from .engine_config import EngineConfig
from .prepared import Prepared


class Engine(Protocol):
    """What `run_documents` asks of the engine (engine.Engine, which imports this module): each document prepared,
    answered and finished as a lone request's would be, through the engine's encodings and deepening."""

    config: EngineConfig
    encodings: EncodingPolicy
    deepening: Deepener

    def query_ids(self, text: str | None, ids: list[int] | None) -> list[int]: ...

    def prepare(self, request: CompressRequest, scope: str = "") -> Prepared: ...

    def answer(self, job: Prepared) -> list[Selection]: ...

    def finish(self, job: Prepared, selections: list[Selection]) -> CompressResults: ...


def run_documents(engine: Engine, request: CompressRequest, scope: str) -> CompressResults:
    """The results of a `document_ids` request (one per document, in order) for a caller in `scope`; NotFoundError
    naming `document_ids[i]` for a document the scope does not hold, InputError naming the field otherwise."""
    query = request.query_inputs()[0]
    ids = engine.query_ids(query[0], query[1]) if query != (None, None) else None
    jobs, named, cap = [], 0, engine.config.max_request_tokens
    for i in range(len(request.document_ids or ())):
        jobs.append(_prepared(engine, request, i, ids, scope))
        named += jobs[-1].context_ids.numel()
        if named > cap:  # before any of them is computed
            raise InputError("document_ids", f"the first {i + 1} documents hold {named} tokens, over the limit of "
                             f"{cap} one request may name (max_request_tokens)")
    forms = [_together(engine, job) for job in jobs]
    together = [i for i, job in enumerate(jobs) if forms[i] is not None and job.budget < job.context_ids.numel()]
    together = [i for i in together if not _alone_now(engine, jobs, i, forms[i])]
    if together:  # the question's pass after the last gives the states of its layers: those reading others go alone
        last = set(forms[together[-1]].reading().encoded_layers(jobs[together[-1]].layer))
        together = [i for i in together if set(forms[i].reading().encoded_layers(jobs[i].layer)) <= last]
    selections: dict[int, Selection] = {}
    for i, job in enumerate(jobs):
        if i not in together:
            selections[i] = engine.answer(job)[0]
    if together:
        selections.update(zip(together, _select_together(engine, [jobs[i] for i in together],
                                                         [forms[i] for i in together])))
    results = [engine.finish(job, [selections[i]]).results[0] for i, job in enumerate(jobs)]
    if query[0] is not None:
        for result in results:
            result.query = query[0]
    return CompressResults(request.id, None, results)


def _prepared(engine: Engine, request: CompressRequest, index: int, query_ids, scope: str) -> Prepared:
    """Document `index` of the request as a lone request by its id (the question's ids tokenized once)."""
    budget = request.budgets[index] if request.budgets is not None else None
    try:
        lone = dataclasses.replace(request, document_ids=None, budgets=None, document_id=request.document_ids[index],
                                   budget=budget, query=None, query_ids=query_ids)
        return engine.prepare(lone, scope)
    except NotFoundError as exc:
        raise NotFoundError(f"document_ids[{index}]", str(exc).partition(": ")[2]) from None
    except InputError as exc:
        if exc.field == "budget":
            raise InputError(f"budgets[{index}]", str(exc).partition(": ")[2]) from None
        raise


def _together(engine: Engine, job: Prepared) -> Strategy | None:
    """The strategy a document is read with among others (its deepened form where deepening is on), or None
    where the question cannot be moved to it (a strategy reading more than the keys and the query's states)."""
    if job.model is None or not job.queries[0].numel():
        return None
    deep = job.strategy.reading().deepened() if engine.deepening.enabled else None
    form = deep or job.strategy
    return form if form.reading().batchable else None


def _alone_now(engine: Engine, jobs: list[Prepared], index: int, form: Strategy) -> bool:
    """Whether a document that could be read among the others is asked alone this time, as a lone request by
    its id would be, because that costs less now: the only document of a request, unless it is held in the form
    read among others (an agent's first step: the strategy itself, as with nothing cached), or an earlier
    message held only in the strategy's own form the step after it was first asked (a later question of it
    from the cache, while the new message is encoded in full; from the next step on it is taken deeper from
    its kept stream)."""
    held = engine.encodings.held_form(jobs[index], form)
    if len(jobs) == 1:
        return held != "keys"
    return held == "own" and index < len(jobs) - 1 and len(jobs) <= 2


def _select_together(engine: Engine, jobs: list[Prepared], forms: list[Strategy]) -> list[Selection]:
    """One pass of the question after the last document, through its window caches (compressor/shared_query.py),
    moved to each other document. The last one's encoding is this request's where it was made now (a new message)
    or the cache's where it holds its windows, else it is encoded again for the pass (not kept: the same result).
    Each selection's "prefill" is the shared pass plus its document's own encoding where it was made now."""
    states, spent = [], []
    end, model = jobs[-1], jobs[-1].model
    taken_on = []
    with torch.inference_mode():
        for i, (job, form) in enumerate(zip(jobs, forms)):
            clock = time.perf_counter()
            state, resumed = engine.encodings.keys_state(job, form, live=i == len(jobs) - 1)
            states.append(state)
            taken_on.append(resumed)
            spent.append((time.perf_counter() - clock) * 1000.0)
        clock = time.perf_counter()
        last = states[-1]
        if not last.has_windows:
            last = engine.encodings.encode_from_ids(end, forms[-1])
        asked = prefill_query(model, last, end.queries[0])
    shared = (time.perf_counter() - clock) * 1000.0
    selections = []
    for job, form, state, own, resumed in zip(jobs, forms, states, spent, taken_on):
        shared_job = SharedQuestionJob(state, job.context_ids, job.budget, form, job.units)
        (selection,) = select_shared(model, asked, last.length, [shared_job], job.queries[0],
                                     {"prefill": round(shared + own, 3)})
        selection.measured["resumed_tokens"] = resumed
        selections.append(selection)
    return selections
