"""The Prepared stage of a request: checked and tokenized, its document named, how to select decided.

`checked_ids` turns a text or a list of IDs into a checked (T,) tensor, naming the field and the limit
when it cannot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..compressor.pipeline import SelectionJob
from ..compressor.prefill_config import PrefillConfig
from ..compressor.strategies import Strategy
from ..compressor.units import Units
from ..contract.messages import CompressRequest, InputError
from ..models.llama import TruncatedLM
from ..models.tokenize import TooManyTokens, tokenize_text


@dataclass(frozen=True)
class Prepared:
    """A checked, tokenized request on its way through the engine: its context (L,) and
    queries [(Lq,)] as int64 IDs, the document they belong to (its id, and the slot the cache holds
    it in), and how to select."""

    request: CompressRequest
    document_id: str
    slot: str
    context_ids: torch.Tensor
    queries: list[torch.Tensor]
    budget: int
    strategy: Strategy
    layer: int
    prefill: PrefillConfig
    model: TruncatedLM | None
    dca: bool
    started: float
    tokenize_ms: float
    granularity: str = "token"
    units: Units | None = None  # the context's units when granularity is "unit"
    # the slots the context's first `end` tokens would have as a document of the caller's scope, per end (ascending)
    prefix_slots: Callable[[list[int]], list[str]] | None = None
    owner: str = ""  # whose share of the document cache the document counts in (DocumentNames.owner of the scope)

    def selection(self) -> SelectionJob:
        """The request as a SelectionJob of the pipeline (its encodings made there)."""
        return SelectionJob(self.context_ids, self.queries, self.budget, self.strategy, self.units)


def checked_ids(tokenizer, vocab_size: int, name: str, text: str | None, ids: list[int] | None, limit: int,
                limit_name: str, ids_field: str | None = None) -> torch.Tensor:
    """(T,) int64 token ids of a text or checked ids; InputError when empty, too long, off-vocabulary
    (naming `ids_field`, default "<name>_ids", for an id outside 0..vocab_size-1)."""
    ids_field = ids_field or f"{name}_ids"
    if ids is None:
        try:
            tensor = tokenize_text(tokenizer, text, limit)
        except TooManyTokens as exc:
            raise InputError(name, f"{exc.count} tokens exceed the limit of {limit} ({limit_name})") from None
    elif len(ids) > limit:
        raise InputError(name, f"{len(ids)} tokens exceed the limit of {limit} ({limit_name})")
    else:
        try:
            tensor = torch.tensor(ids, dtype=torch.int64)
        except (OverflowError, RuntimeError, ValueError):  # beyond int64: the error path may loop
            bad = next(i for i in ids if not -(1 << 63) <= i < (1 << 63))
            raise InputError(ids_field, f"token id {bad} outside the vocabulary 0..{vocab_size - 1}") from None
    if not tensor.numel():
        raise InputError(name, "has no tokens")
    outside = (tensor < 0) | (tensor >= vocab_size)
    if bool(outside.any()):
        bad = int(tensor[outside][0])
        raise InputError(ids_field, f"token id {bad} outside the vocabulary 0..{vocab_size - 1}")
    return tensor
