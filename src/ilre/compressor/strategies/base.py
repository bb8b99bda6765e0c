"""The interface every selection strategy implements."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, ClassVar

import torch

from ...kernels.query_scores import query_key_scores
from ...models.llama import TruncatedLM
from ..allocation import top_k_indices
from ..candidate_rows import RowMemo
from ..context_state import ContextState, RetrievalState
from ..prefill_config import PrefillConfig


def check_int(name: str, value: object, minimum: int, optional: bool = True) -> None:
    """ValueError naming the option unless value is an integer >= minimum (or None when optional)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum}{' or null' if optional else ''} (got {value!r})")


@dataclass(frozen=True)
class ScoreInputs:
    """What a strategy may score. length: L context tokens; attention: A^C (L,) of eq. 5 at the
    retrieval layer (None when the strategy does not need the model or the query); state: the
    prefill's keys, queries and parts, for strategies that score them themselves; sink: the S
    tokens the pipeline always keeps; budget: the context tokens to keep, sink included;
    coarse_attention: a cascade's A^C (L,) at its coarse layer (then `attention` covers its candidates)."""

    length: int
    attention: torch.Tensor | None = None
    state: RetrievalState | None = None
    sink: int = 0
    budget: int = 0
    coarse_attention: torch.Tensor | None = None


@dataclass(frozen=True)
class QueryPass:
    """What a strategy's `query_attention` reads once the query has run against the encoded context:
    retrieval: the context keys (kv_heads, L, d) and query states (heads, Lq, d) at the encoded layers;
    context_ids (L,) and query_ids (Lq,) int64 (None: not at hand); the budget; the prefill settings;
    deepened: the whole context encoded as the strategy's `deepened()` form reads it, for a strategy that
    falls back to that form (the document cache's; None: the strategy encodes it itself); measured: what
    the strategy measured on the way, for the caller to read (the cascade: `peak`, its peak strength);
    stream: the context's residual stream entering the encoding's top layer (L, D), where the encoding kept
    it (ContextState.hidden; a cascade's candidates then start there); rows: where a cascade's candidate passes
    over the context leave their rows for the next (ContextState.row_memo; None: nowhere)."""

    model: TruncatedLM
    retrieval: RetrievalState
    context_ids: torch.Tensor | None
    query_ids: torch.Tensor
    budget: int
    config: PrefillConfig
    deepened: Callable[[], ContextState] | None = None
    measured: dict[str, float] = field(default_factory=dict)
    stream: torch.Tensor | None = None
    rows: RowMemo | None = None


def option_names(cls: type) -> set[str]:
    """The options a request (or a model's profile) may set on strategy class `cls`: its init fields, less
    those marked internal (metadata {"internal": True}, set by the strategy itself, e.g. the cascade's `whole`)."""
    return {f.name for f in dataclasses.fields(cls) if f.init and not f.metadata.get("internal")}


class Strategy(ABC):
    """A scorer (one score per context token, higher = keep) plus an allocator.

    Subclasses are frozen dataclasses whose fields are their options. Capabilities the pipeline
    reads (it never branches on the concrete type): `encoded_layers`, what the context's prefill keeps;
    `query_attention`, the query's A^C once the query has run; `needs_attention`, whether to run the prefill;
    `needs_query`, whether the scores depend on the query (False: they are computed once per
    encoded context and memoised on it, so a document's later queries skip the query chunk too;
    such a strategy also runs without any query); `context_parts` / `query_parts`, what else the
    prefill keeps at l_R for it (prefill.CONTEXT_PARTS: values, raw_keys; QUERY_PARTS: raw_queries).
    Strategies hold no per-request state, so one instance serves concurrent requests.
    """

    name: ClassVar[str]
    needs_attention: ClassVar[bool] = True
    needs_query: ClassVar[bool] = True
    context_parts: ClassVar[tuple[str, ...]] = ()
    query_parts: ClassVar[tuple[str, ...]] = ()

    @property
    def extra_layers(self) -> tuple[int, ...]:
        """Layers below l_R whose context keys and query states `score` also reads (from `state`)."""
        return ()

    def encoded_layers(self, l_r: int) -> tuple[int, ...]:
        """The layers whose context keys the encoded context holds for the strategy, ascending: its extra
        layers, then l_R. ValueError naming the option when one is not below l_R."""
        above = [layer for layer in self.extra_layers if layer >= l_r]
        if above:
            raise ValueError(f"also_layers: every layer must be below l_R = {l_r} (got {above})")
        return (*self.extra_layers, l_r)

    def query_attention(self, query: QueryPass) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(A^C (L,) at l_R, None) from the query pass; None when the pass holds no l_R query (a
        query-agnostic strategy). A strategy that runs more than the query (a cascade's candidates)
        returns a lower layer's A^C second, for `ScoreInputs.coarse_attention`."""
        retrieval, l_r = query.retrieval, query.model.n_layers
        if l_r not in retrieval.queries:
            return None, None
        return query_key_scores(retrieval.queries[l_r], retrieval.keys[l_r]), None

    def query_attention_many(self, passes: list[QueryPass]) -> list[tuple[torch.Tensor | None, torch.Tensor | None]]:
        """`query_attention` of each pass, for several queries against one encoded context (all passes share
        the retrieval's context keys, the context's ids and `deepened`); a strategy that can share work
        between them (the cascade's candidate pass) does so."""
        return [self.query_attention(query) for query in passes]

    @property
    def falls_back(self) -> bool:
        """Whether a query may read the `deepened()` form's encoding (QueryPass.deepened) on a context
        encoded for this strategy: the caller then keeps the encoding's resume point (ContextState.hidden)."""
        return False

    def reads_deep(self, length: int, budget: int, queries: int, l_r: int) -> bool:
        """Whether a request of `queries` questions over `length` tokens at `budget` may read the `deepened()`
        form's encoding (a fallback, or every question answered from one deep pass when that costs less):
        the caller then keeps the coarse encoding's resume point."""
        return self.falls_back

    def streams_first(self, length: int) -> bool:
        """Whether a context's first question over `length` tokens starts its work from the residual stream entering
        the encoding's top layer (a cascade's candidates, compressor/candidate_prefill.Streams): the caller then
        encodes with keep_hidden and hands the stream on (Encodings.stream)."""
        return False

    @property
    def batchable(self) -> bool:
        """Whether the batched prefill of one-chunk contexts serves the strategy: it keeps keys and query
        states at the encoded layers only, so the strategy needs attention, a query, and no parts."""
        return self.needs_attention and self.needs_query and not self.context_parts and not self.query_parts

    def for_context(self, length: int, budget: int) -> "Strategy":
        """The strategy as it runs on a context of `length` tokens at `budget` (a cascade whose candidates
        would cover the context runs without its coarse layer)."""
        return self

    def deepened(self) -> "Strategy | None":
        """The strategy as it runs on a context encoded in full to l_R, which the engine builds in the
        background once a document has been asked (engine/deepening.py); None: a first query already
        encodes all it reads. A cascade becomes plain ILRe at l_R with its coarse layer blended in."""
        return None

    def with_defaults(self, defaults: dict) -> "Strategy":
        """This strategy with the options it leaves unset (None) taken from `defaults` (a model profile's)."""
        unset = {name: value for name, value in defaults.items()
                 if name in option_names(type(self)) and getattr(self, name) is None}
        return dataclasses.replace(self, **unset) if unset else self

    @property
    def memo_key(self) -> str:
        """Identifies the strategy and its options (the key of memoised query-agnostic scores)."""
        return repr(self)

    @abstractmethod
    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        """-> (L,) float scores over the whole context (sink included)."""

    def select(self, scores: torch.Tensor, budget: int, sink: int) -> torch.Tensor:
        """scores: (L,) over the whole context -> (min(budget, L),) kept indices, ascending: the first
        `sink` tokens (within the budget), then `allocate` over the rest. Strategies whose choice
        depends on where tokens are (partitions, spans) override this instead."""
        sink = min(sink, budget, scores.numel())
        picked = self.allocate(scores[sink:], budget - sink) + sink
        return torch.cat((torch.arange(sink, device=picked.device), picked))

    def allocate(self, scores: torch.Tensor, budget: int) -> torch.Tensor:
        """scores: (L',) sink excluded -> (min(budget, L'),) kept indices, ascending. Default: top-k."""
        return top_k_indices(scores, budget)

    def budget_split(self, budget: int) -> list[tuple[str, int]]:
        """How `allocate` shares out `budget`, for people: (what, tokens) pairs. Default: one top-k."""
        return [("top-k of the scores", budget)]
