"""Context allocation: ILRe Algorithm 1 (multi-kernel pooling), vectorised, and plain top-k.

Readings of what the paper leaves open (tested against a literal loop in tests/reference.py):
- max pooling uses kernel = stride = m; a last partial block is a block of its own;
- avg pooling has stride 1 and keeps the length (window [i-(n-1)//2, i+n//2], in-range mean);
- ranking is by score, ties broken by the lower index (a stable descending sort);
- B / (N_M N_A) is fractional in general: combination c gets floor((c+1)B/N) - floor(cB/N),
  so the combinations add up to exactly B;
- when a combination runs out of candidates (overlap with earlier ones), the tokens still missing
  are filled from the highest raw scores, so exactly B indices come back whenever L >= B.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.pooling import block_max_pool, same_length_avg_pools

ROWS_SORTED = 1024  # pooled rows up to this long are ranked by one sort of all of them (_top_ranked_rows)


def combination_budgets(budget: int, n_combinations: int) -> list[int]:
    """Split `budget` over combinations as evenly as integers allow; sums to `budget` exactly."""
    return [(c + 1) * budget // n_combinations - c * budget // n_combinations for c in range(n_combinations)]


def _ranked(values: torch.Tensor) -> torch.Tensor:
    """Indices of `values` along the last dim, highest first, ties by lower index."""
    return torch.sort(values, dim=-1, descending=True, stable=True).indices


def _top_ranked(values: torch.Tensor, k: int) -> torch.Tensor:
    """`_ranked(values)[:k]` for values (n,) without sorting all n: a top-k finds the k-th value, then only the
    indices above it and the lowest-indexed ties at it are sorted (stably, so ties stay by lower index)."""
    if k >= values.numel():
        return _ranked(values)
    if k <= 0:
        return torch.empty(0, dtype=torch.int64, device=values.device)
    threshold = torch.topk(values, k, sorted=False).values.min()
    above = (values > threshold).nonzero().squeeze(1)
    ties = (values == threshold).nonzero().squeeze(1)[: k - above.numel()]
    chosen = torch.cat((above, ties))  # ascending indices within each part
    return chosen[_ranked(values[chosen])]


def _top_ranked_rows(values: torch.Tensor, k: int) -> torch.Tensor:
    """`_top_ranked(row, k)` for each row of values (R, n) -> (R, min(k, n)): rows up to ROWS_SORTED long are
    sorted together in one call (a short context's pooled rows), longer ones each by `_top_ranked`."""
    if values.shape[1] <= ROWS_SORTED:
        return _ranked(values)[:, :k]
    return torch.stack([_top_ranked(row, k) for row in values])


def top_k_indices(scores: torch.Tensor, budget: int) -> torch.Tensor:
    """The `budget` highest-scoring indices of scores (L,), ties by lower index; sorted ascending."""
    return _top_ranked(scores, budget).sort().values


@dataclass(frozen=True)
class PoolingAllocator:
    """Algorithm 1 of ILRe: every (max kernel m, avg kernel n) combination proposes its top
    B/m + 1 blocks of AvgPool_n(MaxPool_m(A^C)) and adds not-yet-taken tokens until it has added
    its share of the budget. SnapKV is the case max_kernels=(1,), avg_kernels=(k,)."""

    max_kernels: tuple[int, ...] = (2, 4, 8)
    avg_kernels: tuple[int, ...] = tuple(range(1, 17))

    def __post_init__(self) -> None:
        for name in ("max_kernels", "avg_kernels"):
            sizes = getattr(self, name)
            if (
                not isinstance(sizes, (list, tuple))
                or not sizes
                or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes)
            ):
                raise ValueError(f"{name}: need at least one kernel, each an integer >= 1 (got {sizes!r})")
            object.__setattr__(self, name, tuple(sizes))

    def split(self, budget: int) -> list[tuple[str, int]]:
        """Each combination's share of `budget`, as ("max m / avg n", tokens), in Algorithm 1's order."""
        names = [f"max {m} / avg {n}" for m in self.max_kernels for n in self.avg_kernels]
        return list(zip(names, combination_budgets(budget, len(names))))

    def allocate(self, scores: torch.Tensor, budget: int) -> torch.Tensor:
        """scores: (L,) per-token scores (sink excluded) -> (min(budget, L),) int64 indices, ascending."""
        length = scores.numel()
        if budget >= length:
            return torch.arange(length, device=scores.device)
        taken = torch.zeros(length, dtype=torch.bool, device=scores.device)
        shares = iter(combination_budgets(budget, len(self.max_kernels) * len(self.avg_kernels)))
        for m in self.max_kernels:
            k_m = budget // m + 1
            maxed = block_max_pool(scores, m)  # (ceil(L/m),)
            offsets = torch.arange(m, device=scores.device)
            pooled = same_length_avg_pools(maxed, self.avg_kernels)  # (len(avg_kernels), ceil(L/m)): one cumsum
            blocks = _top_ranked_rows(pooled, k_m)  # (len(avg_kernels), K_m): each row's best blocks, ranked
            tokens = (blocks.unsqueeze(-1) * m + offsets).flatten(1)  # (len(avg_kernels), K_m * m) token indices
            for row in tokens:
                row = row[row < length]
                fresh = row[~taken[row]]
                taken[fresh[: next(shares)]] = True
        missing = budget - int(taken.sum())
        if missing > 0:
            order = _ranked(scores)
            taken[order[~taken[order]][:missing]] = True
        return taken.nonzero().squeeze(1)
