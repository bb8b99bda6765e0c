"""One question asked of several encoded contexts at once (a conversation's messages): one query pass, moved to each.

In the prompt an engine sees, a step's question follows the whole conversation, not each message alone. So the
question runs once, as one more chunk after the conversation's end (the last context, through its own window
caches: `prefill_query`), and its states at every score layer are moved by RoPE to each other context's end
(R(L_i - L_end) q: as if it followed that context), where they are scored against that context's keys as a query
pass of its own would score them (`score_keys`: DCA's moves included) and the strategy allocates that context's
budget. The last context is scored exactly as alone; each other one needs only its keys at the score layers
(ContextState.keys_only): no window caches, no query pass of its own, and a step costs one pass however long the
conversation. For those it approximates asking each alone (below l_R the question saw the end's window, not
theirs): bench/shared_question_agreement.py measures how close.

Data flow:
  the end's encoding -> prefill_query: q_l (heads, Lq, d) at every score layer, at positions L_end..
  per context i: q_l moved by L_i - L_end -> its reading plan's attention (A^C over its L_i keys) -> score, allocate
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..kernels.rope import rerotate
from ..models.llama import TruncatedLM
from .context_state import ContextState, RetrievalState, score_keys
from .pipeline import Selection, score_and_allocate
from .reading import QueryPass
from .strategies import ScoreInputs, Strategy
from .units import Units


@dataclass(frozen=True)
class SharedQuestionJob:
    """One context of `select_shared`: its encoding `state` (keys at the strategy's layers; windows not read),
    its ids (L,) int64, its budget, the strategy as it runs on it (Reading.for_context) and its units (None:
    single tokens)."""

    state: ContextState
    context_ids: torch.Tensor
    budget: int
    strategy: Strategy
    units: Units | None = None


def moved_queries(queries: dict[int, torch.Tensor], inv_freq: torch.Tensor, shift: int) -> dict[int, torch.Tensor]:
    """Query states (heads, Lq, d) per layer moved by `shift` positions (R(shift) q: RoPE's rotations compose), in
    float32 (the scores read them so)."""
    return {layer: rerotate(q.float(), inv_freq, shift) for layer, q in queries.items()}


def select_shared(model: TruncatedLM, asked: RetrievalState, at: int, jobs: list[SharedQuestionJob],
                  query_ids: torch.Tensor, timings: dict[str, float] | None = None) -> list[Selection]:
    """Each job's Selection for the question `asked` (`prefill_query` after a context of `at` tokens, the
    conversation's end): its states moved to the job's end, scored against its keys, its budget allocated (whole
    units where it has units). A context that fits its budget passes through. `timings` (ms, e.g. the shared pass's
    "prefill") start each Selection's."""
    selections = []
    for job in jobs:
        length, own = job.state.length, dict(timings or {})
        if length <= job.budget:
            selections.append(Selection(torch.arange(length), own, passthrough=True))
            continue
        plan = job.strategy.reading()
        missing = set(plan.encoded_layers(model.n_layers)) - set(job.state.keys)
        if missing or plan.context_parts or plan.query_parts:
            raise ValueError(f"strategy: {job.strategy.name} reads layers {sorted(missing)} or parts that a shared "
                             "question does not give")
        clock = time.perf_counter()
        with torch.inference_mode():
            queries = moved_queries({l: q for l, q in asked.queries.items() if l in job.state.keys}, model.inv_freq,
                                    length - at)
            retrieval = RetrievalState(score_keys(model, job.state), queries, dict(job.state.parts))
            query = QueryPass(model, retrieval, job.context_ids, query_ids, job.budget, job.state.config)
            attention, coarse = plan.attention(query)
        own["prefill"] = round(own.get("prefill", 0.0) + (time.perf_counter() - clock) * 1000.0, 3)
        inputs = ScoreInputs(length=length, attention=attention, state=retrieval, sink=job.state.config.sink,
                             budget=job.budget, coarse_attention=coarse)
        selection = score_and_allocate(inputs, job.strategy, own, job.units)
        selection.measured = query.measured
        selections.append(selection)
    return selections
