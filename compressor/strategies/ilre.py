"""ILRe: query attention at the retrieval layer, multi-kernel pooling allocation (Algorithm 1)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..allocation import PoolingAllocator
from .base import ScoreInputs, Strategy


@dataclass(frozen=True)
class ILRe(Strategy):
    """Parameters: max_kernels {2,4,8} and avg_kernels {1..16} as in the paper (48 combinations).
    Paper: Intermediate Layer Retrieval for context compression (ILRe)."""

    name = "ilre"
    max_kernels: tuple[int, ...] = (2, 4, 8)
    avg_kernels: tuple[int, ...] = tuple(range(1, 17))
    allocator: PoolingAllocator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "allocator", PoolingAllocator(self.max_kernels, self.avg_kernels))

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        return inputs.attention

    def allocate(self, scores: torch.Tensor, budget: int) -> torch.Tensor:
        return self.allocator.allocate(scores, budget)

    def budget_split(self, budget: int) -> list[tuple[str, int]]:
        return self.allocator.split(budget)
