"""What the streaming prefill keeps per layer below the top: the sink and window K/V of an attention layer
(window_cache.py), or the recurrent state of a layer without attention (a linear-attention or state-space layer
run through its family's own code: models/transformers_lm.py), carried from chunk to chunk, which is exact."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..models.spec import LINEAR
from .prefill_config import PrefillConfig
from .window_cache import WindowCache


def layer_cache(model, layer: int, config: PrefillConfig, slot: int, held: int = 0) -> "WindowCache | RecurrentCache":
    """The cache of 1-based `layer` below the top: a RecurrentCache for a layer without attention, else a
    WindowCache (slot: rows for the chunk; held: as WindowCache's)."""
    if model.spec.kind(layer) == LINEAR:
        return RecurrentCache(model)
    return WindowCache(config, slot, model, held=held, layer=layer)


@dataclass
class Mixing:
    """What a layer without attention runs with (its `finish`): the family's cache holding its state, and the
    chunk's positions (T,)."""

    cache: Any
    positions: torch.Tensor


class RecurrentCache:
    """A layer without attention's state between chunks: a transformers cache the family's layer reads and
    advances (conv and recurrent states). `attend` hands it on (a frozen one, a copy: a query leaves it as it
    was); `append` counts the chunk. Not stored by the shared document tier (`to_tensors` refuses it)."""

    def __init__(self, model, cache: Any = None, seen: int = 0):
        self.model = model
        self.cache = model.new_cache() if cache is None else cache
        self.seen = seen
        self.frozen = False

    @property
    def nbytes(self) -> int:
        """Bytes of the states held."""
        return sum(t.numel() * t.element_size() for t in _tensors(self.cache))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink_shift: int,
               inv_freq: torch.Tensor | None) -> Mixing:
        """q = k = v: the chunk's hidden states (..., T, D) -> the Mixing its layer runs with."""
        from ..models.transformers_lm import copied_cache

        positions = torch.arange(self.seen, self.seen + q.shape[-2], device=q.device)
        return Mixing(copied_cache(self.cache) if self.frozen else self.cache, positions)

    def append(self, k: torch.Tensor, v: torch.Tensor, first: bool) -> None:
        if self.frozen:
            raise RuntimeError("a frozen recurrent cache takes no more context chunks")
        self.seen += k.shape[-2]

    def freeze(self) -> None:
        self.frozen = True

    def snapshot(self) -> "RecurrentCache":
        from ..models.transformers_lm import copied_cache

        copy = RecurrentCache(self.model, copied_cache(self.cache), self.seen)
        copy.frozen = True
        return copy

    def thawed(self, config: PrefillConfig, model) -> "RecurrentCache":
        from ..models.transformers_lm import copied_cache

        return RecurrentCache(model, copied_cache(self.cache), self.seen)

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """The states stay where the family's cache keeps them."""


def _tensors(cache: Any) -> list[torch.Tensor]:
    """Every tensor a transformers cache holds (its layers' attributes)."""
    found = []
    for layer in getattr(cache, "layers", ()):
        for value in vars(layer).values():
            if isinstance(value, torch.Tensor):
                found.append(value)
            elif isinstance(value, (list, tuple)):
                found.extend(t for t in value if isinstance(t, torch.Tensor))
    return found
