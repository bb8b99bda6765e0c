"""Pooling of per-token scores for the context allocation (ILRe Algorithm 1)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def block_max_pool(scores: torch.Tensor, size: int) -> torch.Tensor:
    """MaxPooling with kernel = stride = `size`: (L,) -> (ceil(L / size),).

    Block b covers tokens [b*size, (b+1)*size); a last partial block is a block of its own.
    """
    if size == 1:
        return scores
    pad = (-scores.numel()) % size
    padded = F.pad(scores, (0, pad), value=-torch.inf)
    return padded.view(-1, size).amax(dim=1)


def same_length_avg_pools(values: torch.Tensor, sizes: list[int] | tuple[int, ...]) -> torch.Tensor:
    """AvgPooling with stride 1 for several kernel sizes at once: (N,) -> (len(sizes), N).

    Output i of kernel n averages the window [i - (n-1)//2, i + n//2] clipped to [0, N): centred for
    odd n, one more on the right for even n, and borders average only the in-range values, so
    index i stays block i and edges are not penalised by padding. Computed from one float64
    cumulative sum.
    """
    n = values.numel()
    csum = torch.cat((values.new_zeros(1, dtype=torch.float64), values.double().cumsum(0)))
    idx = torch.arange(n, device=values.device)
    rows = []
    for size in sizes:
        lo = (idx - (size - 1) // 2).clamp(min=0)
        hi = (idx + size // 2 + 1).clamp(max=n)
        rows.append((csum[hi] - csum[lo]) / (hi - lo))
    return torch.stack(rows)
