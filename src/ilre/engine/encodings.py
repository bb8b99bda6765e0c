"""The encoding policy, in one place: which encoded context a request reads, what the document cache keeps,
what a query that falls back reads, and which documents are offered for deepening.

`EncodingPolicy.plan(job)` decides what runs (the job's strategy, or its deepened form where the document is
held deep) and hands the pipeline one `DocumentEncodings` (compressor/pipeline.Encodings): the encoding the
strategy reads, from the cache or encoded now and kept, and the deeper one its fallback reads, from the
cache, else taken on from this request's coarse encoding (layers 1..l_c not run again), else encoded now.
`settle` then records what the fallback cost and offers the document for deepening.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from ..compressor.pipeline import Selection, once, resumed
from ..compressor.prefill import ContextState, encode_context, encode_in_steps
from ..compressor.strategies import Strategy
from .deepening import Deepener
from .documents import DocumentCache, state_key
from .prepared import Prepared


class DocumentEncodings:
    """A request's encodings (compressor/pipeline.Encodings) read from and kept in the document cache.
    `keep_resume`: when the strategy's encoding is made here and the questions may read the deep one, keep
    the way on to it (the residual stream at the coarse layer, (L, D), for this request only). `held`: the
    encoding, already taken from the cache. `deepen_ms`: what making the deep encoding took, once asked."""

    def __init__(self, policy: "EncodingPolicy", job: Prepared, strategy: Strategy, keep_resume: bool = False,
                 held: ContextState | None = None):
        self.policy, self.job, self.strategy, self.keep_resume = policy, job, strategy, keep_resume
        self.deepen_ms: float | None = None
        self._resume: Callable[[], ContextState] | None = None
        self.encoded = once(lambda: held if held is not None else self._cached())
        self.deepened = once(self._deep)

    def _cached(self) -> ContextState:
        job, strategy = self.job, self.strategy
        length = job.context_ids.numel()
        keep = self.keep_resume and strategy.for_context(length, job.budget).reads_deep(
            length, job.budget, len(job.queries), job.layer)

        def encode() -> ContextState:
            state = encode_context(job.model, job.context_ids, job.prefill, strategy.encoded_layers(job.layer),
                                   parts=strategy.context_parts, keep_hidden=keep)
            if keep:
                self._resume = resumed(job.model, state, strategy.deepened())
            return state

        return self.policy.documents.state(job.slot, self.policy.key(job, strategy), encode, self.policy.restore(job))

    def _deep(self) -> ContextState:
        """The deep encoding, kept in the cache (in place of the strategy's own when deepening is on: the
        document's later queries then read it; with it off they run the strategy, which needs its own too)."""
        job, policy, deep = self.job, self.policy, self.strategy.deepened()
        clock = time.perf_counter()
        key = policy.key(job, deep)
        held = policy.documents.held_state(job.slot, key, policy.restore(job))
        if held is None:
            held = self._resume() if self._resume is not None else encode_context(
                job.model, job.context_ids, job.prefill, deep.encoded_layers(job.layer), parts=deep.context_parts)
            replaces = policy.key(job, self.strategy) if policy.deepening.enabled else None
            policy.documents.store_state(job.slot, key, held, replaces=replaces)
        self.deepen_ms = round((time.perf_counter() - clock) * 1000.0, 3)
        return held


@dataclass
class EncodingPlan:
    """What a request runs: `strategy` (the job's, or its deepened form), reading `encodings`; `offer`: the
    deepened form to offer the document for once answered (None: no offer)."""

    strategy: Strategy
    encodings: DocumentEncodings
    offer: Strategy | None = None


class EncodingPolicy:
    """The engine's encoding policy over its document cache and its background deepening."""

    def __init__(self, documents: DocumentCache, deepening: Deepener, dtype_name: str):
        self.documents, self.deepening, self.dtype_name = documents, deepening, dtype_name

    def key(self, job: Prepared, strategy: Strategy) -> str:
        """The document cache's key of the encoded context `strategy` reads on this job's layer and prefill."""
        layers = strategy.encoded_layers(job.layer)
        top = max(layers)  # the deepest layer encoded: l_R, or a cascade's coarse layer
        return state_key(top, job.prefill, self.dtype_name, strategy.context_parts, tuple(l for l in layers if l != top))

    def restore(self, job: Prepared) -> Callable[[dict[str, torch.Tensor]], ContextState]:
        return lambda tensors: ContextState.from_tensors(job.model, job.prefill, tensors)

    def plan(self, job: Prepared) -> EncodingPlan:
        """With deepening on, a document encoded to full depth (in the background, or by an earlier query whose
        candidates missed) is served by the strategy's deepened form, and one that was not is offered for it
        once its queries are answered. With it off, every query runs the strategy itself (a cascade's
        fallback then reads the full-depth encoding an earlier query left)."""
        deep = job.strategy.deepened() if self.deepening.enabled else None
        if deep is not None:
            held = self.documents.held_state(job.slot, self.key(job, deep), self.restore(job))
            if held is not None:
                return EncodingPlan(deep, DocumentEncodings(self, job, deep, held=held))
        return EncodingPlan(job.strategy, DocumentEncodings(self, job, job.strategy, keep_resume=True), deep)

    def settle(self, job: Prepared, plan: EncodingPlan, selections: list[Selection]) -> None:
        """After the queries: the first selection that read the deep encoding carries what it took ("deepen"
        timing), and a document not yet held deep is offered for deepening."""
        spent = plan.encodings.deepen_ms
        if spent is not None:
            deep = [s for s in selections if s.measured.get("deep")] or selections
            deep[0].timings_ms["deepen"] = spent
        if plan.offer is not None and not self.documents.holds(job.slot, self.key(job, plan.offer)):
            self._offer(job, plan.offer)

    def encode(self, job: Prepared) -> ContextState:
        """The job's encoded context as its strategy reads it: the cache's, or encoded now and kept there."""
        return DocumentEncodings(self, job, job.strategy).encoded()

    def _offer(self, job: Prepared, deep: Strategy) -> None:
        """Queue the job's document for deepening: the encoding `deep` reads, which then replaces the one the
        job's strategy read."""
        slot, key, first = job.slot, self.key(job, deep), self.key(job, job.strategy)
        model, context_ids, prefill = job.model, job.context_ids, job.prefill
        layers = deep.encoded_layers(job.layer)
        self.deepening.offer(
            f"{slot}/{key}",
            start=lambda: encode_in_steps(model, context_ids, prefill, layers, parts=deep.context_parts),
            store=lambda state: self.documents.store_state(slot, key, state, replaces=first),
            wanted=lambda: self.documents.holds(slot) and not self.documents.holds(slot, key))
