"""SnapKV: the same query attention, one average-pooling kernel, plain top-k (arXiv 2404.14469)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..allocation import PoolingAllocator
from .base import ScoreInputs, Strategy


@dataclass(frozen=True)
class SnapKV(Strategy):
    """Parameters: kernel_size of the average pooling (SnapKV's default 5). Equivalent to
    Algorithm 1 with one max kernel of size 1 and one avg kernel."""

    name = "snapkv"
    kernel_size: int = 5
    allocator: PoolingAllocator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        size = self.kernel_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"kernel_size: must be an integer >= 1 (got {size!r})")
        object.__setattr__(self, "allocator", PoolingAllocator((1,), (size,)))

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        return inputs.attention

    def allocate(self, scores: torch.Tensor, budget: int) -> torch.Tensor:
        return self.allocator.allocate(scores, budget)

    def budget_split(self, budget: int) -> list[tuple[str, int]]:
        return self.allocator.split(budget)
