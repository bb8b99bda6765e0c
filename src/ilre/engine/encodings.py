"""The encoding policy, in one place: which encoded context a request reads, what the document cache keeps,
what a query that falls back reads, and which documents are offered for deepening.

`EncodingPolicy.plan(job)` decides what runs (the job's strategy, or its deepened form where the document is
held deep) and hands the pipeline one `DocumentEncodings` (compressor/pipeline.Encodings): the encoding the
strategy reads, from the cache or encoded now and kept, and the deeper one its fallback reads, from the
cache, else taken on from this request's coarse encoding (layers 1..l_c not run again), else encoded now.
`settle` then records what the fallback cost and offers the document for deepening.

Every encoding made here is taken on from the longest of the caller's own cached encodings of a prefix of the
context (a conversation one turn longer, a tool result appended): `EncodingPolicy.steps` finds it by the slots
the context's chunk boundaries would have as documents (engine/document_names.py: keyed digests of the scope and
the exact IDs) and runs the new chunks only (compressor/prefill.extend_context).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Generator

import torch

from ..compressor.context_state import ContextState, chunk_bounds
from ..compressor.pipeline import OnceEncodings, Selection, resumed
from ..compressor.prefill import encode_context, encode_in_steps, extend_in_steps, resume_in_steps, run_steps
from ..compressor.strategies import Strategy
from .deepening import Deepener
from .documents import DocumentCache, KEYS_ONLY, state_key
from .prepared import Prepared



class DocumentEncodings(OnceEncodings):
    """A request's encodings (compressor/pipeline.Encodings) read from and kept in the document cache.
    `keep_resume`: when the strategy's encoding is made here and the questions may read the deep one, keep
    the way on to it (the residual stream at the coarse layer, (L, D), for this request only). `held`: the
    encoding, already taken from the cache. `deepen_ms`: what making the deep encoding took, once asked."""

    def __init__(self, policy: "EncodingPolicy", job: Prepared, strategy: Strategy, keep_resume: bool = False,
                 held: ContextState | None = None, prefix: ContextState | None = None):
        self.policy, self.job, self.strategy, self.keep_resume = policy, job, strategy, keep_resume
        self.prefix = prefix  # the cached encoding of a prefix the strategy's encoding takes on, already found
        self.deepen_ms: float | None = None
        self.resumed_tokens = 0  # of the context, taken on from a cached prefix's encoding by this request
        self._resume: Callable[[], ContextState] | None = None
        self._encoded = held
        self._first = False  # the encoding was made from the start by this request (its first question)
        self._first_stream: torch.Tensor | None = None  # the stream its first question's candidates start from

    def stream(self) -> torch.Tensor | None:
        """The encoding's stream at its top layer, where the questions' candidates start: a document's later questions
        and a context that takes a kept encoding on start them there, and its first question too where the strategy
        streams first (Reading.streams_first; the stream then kept for this request when the cache keeps none)."""
        encoded = self._encoded
        if encoded is None:
            return None
        return self._first_stream if self._first else encoded.hidden

    def holds_rows(self) -> bool:
        """Whether the encoding read holds the rows of a candidate pass (compressor/candidate_rows.py), which grow
        it in place after the cache counted it."""
        encoded = self._encoded
        return encoded is not None and encoded.rows is not None and encoded.rows.rows is not None

    def _make_encoded(self) -> ContextState:
        job, strategy = self.job, self.strategy
        length = job.context_ids.numel()
        runs = strategy.reading().for_context(length, job.budget)
        streamed, first = self.policy.keeps_stream(runs.scorer), runs.streams_first(length)
        keep = streamed or first or self.keep_resume and runs.reads_deep(length, job.budget, len(job.queries), job.layer)

        def encode() -> ContextState:
            state = self._encode(strategy, keep)
            self._first = self.resumed_tokens == 0  # encoded from the start: the document's first question
            if state.hidden is not None:
                if self._first and first:
                    self._first_stream = state.hidden
                self._resume = resumed(job.model, state, strategy.reading().deepened(), take=not streamed)
            return state

        return self.policy.documents.state(job.slot, self.policy.key(job, strategy), encode, self.policy.restore(job),
                                           job.owner)

    def _encode(self, strategy: Strategy, keep_hidden: bool = False) -> ContextState:
        """The encoding `strategy` reads, made now (taken on from a cached prefix where the caller holds one), its
        resume point named in the cache."""
        found = self.prefix if strategy is self.strategy else None
        steps, resumed = self.policy.steps(self.job, strategy, keep_hidden, found)
        self.resumed_tokens = max(self.resumed_tokens, resumed)
        state = run_steps(steps)
        self.policy.name_prefix(self.job, state)
        return state

    def _make_deepened(self) -> ContextState:
        """The deep encoding, kept in the cache (in place of the strategy's own when deepening is on: the
        document's later queries then read it; with it off they run the strategy, which needs its own too)."""
        job, policy, deep = self.job, self.policy, self.strategy.reading().deepened()
        clock = time.perf_counter()
        key = policy.key(job, deep)
        held = policy.documents.held_state(job.slot, key, policy.restore(job))
        if held is None:
            encoded = self._encoded
            if self._resume is None and encoded is not None and encoded.hidden is not None:  # held with its stream
                self._resume = resumed(job.model, encoded, deep, take=False)
            if self._resume is not None:
                held = self._resume()
                policy.name_prefix(job, held)
            else:
                held = self._encode(deep)
            replaces = policy.key(job, self.strategy) if policy.deepening.enabled else None
            policy.documents.store_state(job.slot, key, held, replaces=replaces, owner=job.owner)
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

    def __init__(self, documents: DocumentCache, deepening: Deepener, dtype_name: str, resume: bool = True,
                 hold_streams: bool = False):
        self.documents, self.deepening, self.dtype_name, self.resume = documents, deepening, dtype_name, resume
        self.hold_streams = hold_streams  # without deepening, cached encodings still hold their stream (keeps_stream)

    @property
    def holds_streams(self) -> bool:
        """Whether cached encodings hold their stream at all (deepening on, or `--deepen hold`)."""
        return self.deepening.enabled or self.hold_streams

    def keeps_stream(self, strategy: Strategy) -> bool:
        """Whether the cached encoding of `strategy` keeps the residual stream entering its top layer ((L, D), counted by
        the cache's bound): with streams held (deepening on, or `--deepen hold`), for a strategy whose deepened form
        reads deeper (a cascade), so that deepening takes the encoding on from there and the document's later
        questions, and a context that grows it, start their candidates there (compressor/candidate_prefill.Streams).
        The deep encoding that replaces it keeps none."""
        return self.holds_streams and strategy.reading().deepened() is not None

    def key(self, job: Prepared, strategy: Strategy) -> str:
        """The document cache's key of the encoded context `strategy` reads on this job's layer and prefill."""
        plan = strategy.reading()
        layers = plan.encoded_layers(job.layer)
        top = max(layers)  # the deepest layer encoded: l_R, or a cascade's coarse layer
        return state_key(top, job.prefill, self.dtype_name, plan.context_parts, tuple(l for l in layers if l != top))

    def restore(self, job: Prepared) -> Callable[[dict[str, torch.Tensor]], ContextState]:
        return lambda tensors: ContextState.from_tensors(job.model, job.prefill, tensors)

    def steps(self, job: Prepared, strategy: Strategy, keep_hidden: bool = False, found: ContextState | None = None
              ) -> tuple[Generator[None, None, ContextState], int]:
        """The steps that encode the context `strategy` reads (prefill.encode_in_steps), and how many of its tokens
        they take on from the longest cached encoding of a prefix in the caller's scope (0: from the start).
        keep_hidden: keep the stream at the top, where the prefix's encoding kept its own (else it is left out);
        found: that prefix's encoding, where the caller has looked it up already."""
        found = found if found is not None else self.prefix(job, strategy)
        if found is not None:
            keep = keep_hidden and found.hidden is not None
            return extend_in_steps(job.model, found, job.context_ids, keep), found.resume.at
        plan = strategy.reading()
        return encode_in_steps(job.model, job.context_ids, job.prefill, plan.encoded_layers(job.layer),
                               parts=plan.context_parts, keep_hidden=keep_hidden), 0

    def prefix(self, job: Prepared, strategy: Strategy) -> ContextState | None:
        """The longest cached encoding `strategy` reads of a prefix of the job's context in the caller's scope, that
        the context's prefill can take on from (None: none, or resuming is off)."""
        ends = [end for _, end in chunk_bounds(job.context_ids.numel(), job.prefill)[:-1]]
        if not self.resume or job.prefix_slots is None or not ends:
            return None
        return self.documents.resumable(list(zip(ends, job.prefix_slots(ends)))[::-1], self.key(job, strategy),
                                        self.restore(job))

    def name_prefix(self, job: Prepared, state: ContextState) -> None:
        """Name the job's document, in the cache, as the one a longer context takes `state` on from (with resuming
        off, the state keeps no resume point instead)."""
        if not self.resume:
            state.resume = None
        elif job.prefix_slots is not None and state.resume is not None:
            self.documents.name_prefix(job.prefix_slots([state.resume.at])[0], job.slot)

    def plan(self, job: Prepared) -> EncodingPlan:
        """With deepening on, a document encoded to full depth (in the background, or by an earlier query whose
        candidates missed) is served by the strategy's deepened form, and one that was not is offered for it
        once its queries are answered; a context whose prefix is held deep (a chat one turn longer) takes that deep
        encoding on and is served the same way. With it off, every query runs the strategy itself (a cascade's
        fallback then reads the full-depth encoding an earlier query left)."""
        deep = job.strategy.reading().deepened() if self.deepening.enabled else None
        if deep is not None:
            held = self.documents.held_state(job.slot, self.key(job, deep), self.restore(job))
            if held is not None:
                return EncodingPlan(deep, DocumentEncodings(self, job, deep, held=held))
            if self.documents.holds(job.slot, self.key(job, deep) + KEYS_ONLY):  # a message, read deep before:
                with torch.inference_mode():  # its windows again, for this request only
                    again = self.encode_from_ids(job, deep)
                return EncodingPlan(deep, DocumentEncodings(self, job, deep, held=again))
            prefix = self.prefix(job, deep)
            if prefix is not None:  # a prefix held deep (a chat one turn longer): take that on
                return EncodingPlan(deep, DocumentEncodings(self, job, deep, prefix=prefix))
        return EncodingPlan(job.strategy, DocumentEncodings(self, job, job.strategy, keep_resume=True), deep)

    def settle(self, job: Prepared, plan: EncodingPlan, selections: list[Selection]) -> None:
        """After the queries: the first selection that read the deep encoding carries what it took ("deepen"
        timing), and a document not yet held deep is offered for deepening (unless every query passed it through:
        a context that fits its budget, e.g. a conversation's message being counted, was not asked anything)."""
        for selection in selections:
            selection.measured["resumed_tokens"] = plan.encodings.resumed_tokens
        if plan.encodings.holds_rows():  # a candidate pass left its rows on the cached encoding: counted there
            self.documents.refit(job.slot)
        spent = plan.encodings.deepen_ms
        if spent is not None:
            deep = [s for s in selections if s.measured.get("deep")] or selections
            deep[0].timings_ms["deepen"] = spent
        asked = not all(selection.passthrough for selection in selections)  # a context only counted is not offered
        if asked and plan.offer is not None and not self.documents.holds(job.slot, self.key(job, plan.offer)):
            self._offer(job, plan.offer)

    def encode_from_ids(self, job: Prepared, strategy: Strategy) -> ContextState:
        """The job's context encoded from its IDs as `strategy` reads it, with nothing taken from the cache."""
        plan = strategy.reading()
        return encode_context(job.model, job.context_ids, job.prefill, plan.encoded_layers(job.layer),
                              parts=plan.context_parts)

    def held_form(self, job: Prepared, strategy: Strategy) -> str | None:
        """How this process holds the job's document for `strategy` read among others: "keys" (in that form, whole
        or its keys only), "own" (only in the job strategy's own form, with the stream to take it deeper: a
        message first asked alone), None (not at all)."""
        key = self.key(job, strategy)
        if self.documents.holds(job.slot, key) or self.documents.holds(job.slot, key + KEYS_ONLY):
            return "keys"
        if strategy is not job.strategy and self.documents.holds(job.slot, self.key(job, job.strategy)):
            return "own"
        return None

    def keys_state(self, job: Prepared, strategy: Strategy, live: bool = False) -> tuple[ContextState, int]:
        """The job's encoding as `strategy` reads it when one question is asked of it among others
        (compressor/shared_query.py reads its keys only), and how many of its tokens were taken on from a cached
        prefix. Kept keys only (ContextState.keys_only: no window caches, stream or resume point) in both tiers; the
        conversation's end (`live`: the message most likely to grow, whose windows the next pass may read) keeps
        its whole encoding too, in this process only, until a later request asks it as an earlier message. An
        earlier message held whole (the end of an earlier step, a background deepening) or in its strategy's own
        form (asked alone first: taken deeper from its stream) is kept as its keys from then on. The state
        returned may hold more than its keys; a question asked of the document alone encodes it again."""
        key, restore = self.key(job, strategy), self.restore(job)
        lean = key + KEYS_ONLY
        whole = self.documents.held_state(job.slot, key, restore)
        if whole is not None and (live or not whole.has_windows):
            return whole, 0
        held = self.documents.held_state(job.slot, lean, restore) if whole is None else None
        if held is not None:
            return held, 0
        own_key = self.key(job, job.strategy) if strategy is not job.strategy else None
        own = self.documents.held_state(job.slot, own_key, restore) if own_key and whole is None and not live else None
        resumed = 0
        if whole is not None:  # no longer the end (or deepened while idle): its keys alone from now on
            state = whole
        elif own is not None and own.hidden is not None:
            plan = strategy.reading()
            state = run_steps(resume_in_steps(job.model, own, plan.encoded_layers(job.layer), plan.context_parts))
        elif live:  # taken on from a cached prefix where the message grew (a streamed tool result, a log)
            steps, resumed = self.steps(job, strategy)
            state = run_steps(steps)
            self.name_prefix(job, state)
        else:
            state = self.encode_from_ids(job, strategy)
        if not self.documents.holds(job.slot, lean):
            self.documents.store_state(job.slot, lean, state.keys_only(), owner=job.owner)
        if live:
            self.documents.store_state(job.slot, key, state, owner=job.owner, shared=False)
        else:
            for dropped in [k for k, found in ((key, whole), (own_key, own or whole)) if k and found is not None]:
                self.documents.drop_state(job.slot, dropped, shared=True)
        return state, resumed

    def encode(self, job: Prepared) -> ContextState:
        """The job's encoded context as its strategy reads it: the cache's, or encoded now and kept there."""
        return DocumentEncodings(self, job, job.strategy).encoded()

    def _offer(self, job: Prepared, deep: Strategy) -> None:
        """Queue the job's document for deepening: the encoding `deep` reads, which then replaces the one the
        job's strategy read."""
        slot, key, first = job.slot, self.key(job, deep), self.key(job, job.strategy)

        def store(state: ContextState) -> bool:
            stored = self.documents.store_state(slot, key, state, replaces=first, owner=job.owner)
            self.name_prefix(job, state)
            return stored

        def start() -> Generator[None, None, ContextState]:  # from the held encoding's stream where it kept one
            held = self.documents.held_state(slot, first, self.restore(job))
            if held is not None and held.hidden is not None:
                plan = deep.reading()
                return resume_in_steps(job.model, held, plan.encoded_layers(job.layer), plan.context_parts)
            return self.steps(job, deep)[0]

        self.deepening.offer(
            f"{slot}/{key}",
            start=start,
            store=store,
            wanted=lambda: self.documents.holds(slot) and not self.documents.holds(slot, key),
            owner=job.owner)
