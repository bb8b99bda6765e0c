"""What the document cache holds: a document's entry (its IDs, states and units, and their byte count), the cache's
counters, the key of a state's prefill settings, and the protocol of the tier every worker shares."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..compressor.context_state import ContextState
from ..compressor.prefill_config import PrefillConfig
from ..compressor.units import Units


def state_key(layer: int, prefill: PrefillConfig, dtype: str, parts: tuple[str, ...] = (),
              also_layers: tuple[int, ...] = ()) -> str:
    """The prefill settings a ContextState depends on besides the IDs (and the extra parts and
    lower layers' keys it holds for some strategies, e.g. values for lagkv), as one string."""
    extra = "".join(f"-{part}" for part in sorted(parts)) + "".join(f"-k{l}" for l in sorted(also_layers))
    dca = f"dca{int(prefill.dca)}" + ("u" if prefill.dca else "")  # u: DCA's keys kept unmoved (extendable)
    return f"l{layer}-s{prefill.sink}-w{prefill.window or 0}-c{prefill.chunk}-{dca}-{dtype}{extra}"


KEYS_ONLY = "-keysonly"  # the cache key's suffix of an encoding kept without its window caches (ContextState.keys_only)

class SharedDocuments(Protocol):
    """A store every worker reads (None results = not there; failures are the store's to log)."""

    def get_ids(self, slot: str) -> torch.Tensor | None: ...
    def put_ids(self, slot: str, ids: torch.Tensor, owner: str = "") -> None: ...
    def get_state(self, slot: str, key: str) -> dict[str, torch.Tensor] | None: ...
    def put_state(self, slot: str, key: str, tensors: dict[str, torch.Tensor], owner: str = "") -> None: ...
    def drop_state(self, slot: str, key: str) -> None: ...
    def put_prefix(self, prefix: str, slot: str) -> None: ...
    def get_prefixes(self, prefixes: list[str]) -> list[str | None]: ...


@dataclass
class CacheStats:
    """Counters for /metrics: lookups by kind ("ids", "state") and tier ("local", "shared")."""

    hits: collections.Counter = field(default_factory=collections.Counter)
    misses: collections.Counter = field(default_factory=collections.Counter)
    evictions: int = 0
    evicted: collections.Counter = field(default_factory=collections.Counter)  # by cause: own, pressure
    documents_evicted: collections.Counter = field(default_factory=collections.Counter)  # whole (IDs gone), by cause
    pressure: collections.Counter = field(default_factory=collections.Counter)  # (by owner, of owner) -> entries
    bytes: int = 0
    documents: int = 0


@dataclass
class HeldDocument:
    """A document held in process: its IDs and what was computed from them, under their settings' keys."""

    ids: torch.Tensor
    states: dict[str, ContextState] = field(default_factory=dict)
    uses: int = 1  # requests that named it (its context again, or its id)
    units: dict[str, Units] = field(default_factory=dict)  # units per segmentation setting
    prefixes: set[str] = field(default_factory=set)  # the prefix slots naming it (`DocumentCache.name_prefix`)
    owner: str = ""  # whose share it counts in (DocumentNames.owner of the caller's scope)
    _nbytes: int | None = field(default=None, repr=False)  # `nbytes`, counted once per change

    @property
    def nbytes(self) -> int:
        """The bytes it holds, counted once after each change (`changed`)."""
        if self._nbytes is None:
            self._nbytes = sum(self.part_bytes().values())
        return self._nbytes

    def changed(self) -> None:
        """Its states or units changed (or grew in place): count its bytes again when next asked."""
        self._nbytes = None

    def part_bytes(self) -> dict[str, int]:
        """Bytes held by part: "ids", "units", and each of its states' parts (ContextState.part_bytes) summed."""
        units = [t for units in self.units.values() for t in units.to_tensors().values()]
        out = collections.Counter({"ids": self.ids.numel() * self.ids.element_size(),
                                   "units": sum(t.numel() * t.element_size() for t in units)})
        for state in self.states.values():
            out.update(state.part_bytes())
        return dict(out)
