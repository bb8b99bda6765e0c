"""ILRe: query attention at the retrieval layer, multi-kernel pooling allocation (Algorithm 1)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...kernels.query_scores import blend_layers, query_key_scores
from ..allocation import PoolingAllocator
from .base import ScoreInputs, Strategy, check_int


@dataclass(frozen=True)
class ILRe(Strategy):
    """Parameters: max_kernels {2,4,8} and avg_kernels {1..16} as in the paper (48 combinations).
    also_layers: layers below l_R whose query attention joins l_R's (each scaled to sum 1 outside the
    sink, then the element-wise max), so a token either layer singles out is scored high; () = the paper's l_R alone.
    also_weight: the factor on also_layers' scaled attention before the max (0.5: measured ahead of 1, equal
    footing with l_R, which loses needles named by a synonym; results/eval/notes.md, stage 18).
    Paper: Intermediate Layer Retrieval for context compression (ILRe)."""

    name = "ilre"
    max_kernels: tuple[int, ...] = (2, 4, 8)
    avg_kernels: tuple[int, ...] = tuple(range(1, 17))
    also_layers: tuple[int, ...] = ()
    also_weight: float = 0.5
    allocator: PoolingAllocator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.also_layers, (list, tuple)):
            raise ValueError(f"also_layers: must be a list of layers (got {self.also_layers!r})")
        for layer in self.also_layers:
            check_int("also_layers", layer, 1, optional=False)
        object.__setattr__(self, "also_layers", tuple(sorted(set(self.also_layers))))
        weight = self.also_weight
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight <= 1:
            raise ValueError(f"also_weight: must be a number > 0 and <= 1 (got {weight!r})")
        object.__setattr__(self, "allocator", PoolingAllocator(self.max_kernels, self.avg_kernels))

    @property
    def extra_layers(self) -> tuple[int, ...]:
        return self.also_layers

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        """A^C (L,) at l_R, or with also_layers the max over layers of each layer's A^C / its sum (the
        lower layers' times also_weight)."""
        if not self.also_layers:
            return inputs.attention
        state = inputs.state
        lower = [query_key_scores(state.queries[l], state.keys[l]) for l in self.also_layers]
        return blend_layers(inputs.attention, lower, self.also_weight, inputs.sink)

    def allocate(self, scores: torch.Tensor, budget: int) -> torch.Tensor:
        return self.allocator.allocate(scores, budget)

    def budget_split(self, budget: int) -> list[tuple[str, int]]:
        return self.allocator.split(budget)
