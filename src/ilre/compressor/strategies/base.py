"""The interface every selection strategy implements."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ..allocation import top_k_indices
from ..context_state import RetrievalState
from ..reading import Reading


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


def option_names(cls: type) -> set[str]:
    """The options a request (or a model's profile) may set on strategy class `cls`: its init fields, less
    those marked internal (metadata {"internal": True}, set by the strategy itself, e.g. the cascade's `whole`)."""
    return {f.name for f in dataclasses.fields(cls) if f.init and not f.metadata.get("internal")}


class Strategy(ABC):
    """A scorer (one score per context token, higher = keep) plus an allocator.

    Subclasses are frozen dataclasses whose fields are their options. Capabilities the pipeline
    reads (it never branches on the concrete type): `encoded_layers`, what the context's prefill keeps;
    `reading`, how the context is read for it (compressor/reading.py); `needs_attention`, whether to run the prefill;
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

    def reading(self) -> Reading:
        """How a request reads the context for this strategy (compressor/reading.py), resolved once per request:
        by default one query pass at l_R over the layers it encodes; the cascade's is its candidate pass."""
        return Reading(self)

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
