"""How a request reads its context for its scorer: the reading plan, resolved once per request (`Strategy.reading`).

A scorer (compressor/strategies/) says what it scores and how it allocates; the plan says what the context's
encoding holds, how a query's attention is obtained from it, and whether a query may read a deeper encoding.
The pipeline, the engine's encodings and the document paths ask the plan, never the scorer, about reading.

`Reading`, the default: the scorer's layers encoded, one query pass, the query's attention at l_R. The cascade
(compressor/cascade_reading.py) is a plan around a scorer: a shallow layer's attention picks candidates that run on
to l_R, with a fallback to the whole context read to l_R.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from ..kernels.query_scores import query_key_scores
from ..models.llama import TruncatedLM
from .candidate_rows import RowMemo
from .context_state import ContextState, RetrievalState
from .prefill_config import PrefillConfig


class Scorer(Protocol):
    """What a plan asks of the strategy it reads for (compressor/strategies/base.Strategy)."""

    name: str
    needs_attention: bool
    needs_query: bool
    context_parts: tuple[str, ...]
    query_parts: tuple[str, ...]

    def encoded_layers(self, l_r: int) -> tuple[int, ...]: ...

    def reading(self) -> "Reading": ...


@dataclass(frozen=True)
class QueryPass:
    """What a plan's `attention` reads once the query has run against the encoded context:
    retrieval: the context keys (kv_heads, L, d) and query states (heads, Lq, d) at the encoded layers;
    context_ids (L,) and query_ids (Lq,) int64 (None: not at hand); the budget; the prefill settings;
    deepened: the whole context encoded as the plan's `deepened()` form reads it, for a plan that falls back to
    that form (the document cache's; None: the plan encodes it itself); measured: what the plan measured on the
    way, for the caller to read (the cascade: `peak`, its peak strength); stream: the context's residual stream
    entering the encoding's top layer (L, D), where the encoding kept it (ContextState.hidden; a cascade's
    candidates then start there); rows: where a cascade's candidate passes over the context leave their rows for
    the next (ContextState.row_memo; None: nowhere)."""

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


@dataclass(frozen=True)
class Reading:
    """The default plan: the scorer's layers encoded (its extra layers, then l_R), one query pass, the query's
    A^C at l_R (None for a scorer that needs no query)."""

    scorer: Scorer

    def encoded_layers(self, l_r: int) -> tuple[int, ...]:
        """The layers whose context keys the encoding holds, ascending (ValueError naming the option when one
        cannot be read below l_R)."""
        return self.scorer.encoded_layers(l_r)

    @property
    def context_parts(self) -> tuple[str, ...]:
        """What else the encoding keeps at l_R (prefill.CONTEXT_PARTS)."""
        return self.scorer.context_parts

    @property
    def query_parts(self) -> tuple[str, ...]:
        """What else the query pass keeps at l_R (prefill.QUERY_PARTS)."""
        return self.scorer.query_parts

    def attention(self, query: QueryPass) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(A^C (L,) at l_R, None) from the query pass; None when the pass holds no l_R query (a query-agnostic
        scorer). A plan that runs more than the query (a cascade's candidates) returns a lower layer's A^C second,
        for `ScoreInputs.coarse_attention`."""
        retrieval, l_r = query.retrieval, query.model.n_layers
        if l_r not in retrieval.queries:
            return None, None
        return query_key_scores(retrieval.queries[l_r], retrieval.keys[l_r]), None

    def attention_many(self, passes: list[QueryPass]) -> list[tuple[torch.Tensor | None, torch.Tensor | None]]:
        """`attention` of each pass, for several queries against one encoded context (all passes share the
        retrieval's context keys, the context's ids and `deepened`); a plan that can share work between them (the
        cascade's candidate pass) does so."""
        return [self.attention(query) for query in passes]

    @property
    def falls_back(self) -> bool:
        """Whether a query may read the `deepened()` form's encoding (QueryPass.deepened) on a context encoded for
        this plan: the caller then keeps the encoding's resume point (ContextState.hidden)."""
        return False

    def reads_deep(self, length: int, budget: int, queries: int, l_r: int) -> bool:
        """Whether a request of `queries` questions over `length` tokens at `budget` may read the `deepened()`
        form's encoding (a fallback, or every question answered from one deep pass when that costs less): the
        caller then keeps the encoding's resume point."""
        return self.falls_back

    def streams_first(self, length: int) -> bool:
        """Whether a context's first question over `length` tokens starts its work from the residual stream entering
        the encoding's top layer (a cascade's candidates, compressor/candidate_prefill.Streams): the caller then
        encodes with keep_hidden and hands the stream on (Encodings.stream)."""
        return False

    @property
    def batchable(self) -> bool:
        """Whether the batched prefill of one-chunk contexts serves the plan: it keeps keys and query states at the
        encoded layers only, so the scorer needs attention, a query, and no parts."""
        scorer = self.scorer
        return scorer.needs_attention and scorer.needs_query and not self.context_parts and not self.query_parts

    def for_context(self, length: int, budget: int) -> "Reading":
        """The plan as it runs on a context of `length` tokens at `budget` (a cascade whose candidates would cover
        the context reads it whole)."""
        return self

    def deepened(self) -> Scorer | None:
        """The scorer as it runs on a context encoded in full to l_R, which the engine builds in the background
        once a document has been asked (engine/deepening.py); None: a first query already encodes all it reads.
        A cascade's is plain ILRe at l_R with its coarse layer blended in."""
        return None
