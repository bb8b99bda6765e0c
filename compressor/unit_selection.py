"""Keeping whole units (compressor/units.py) instead of single tokens, for any strategy.

The rule, with `tokens` the strategy's own token selection at the budget (Algorithm 1 for ILRe and
the cascade, top-k, partitions or chunks for the others):

1. A unit's score is its best token score plus `coverage` times its mean token score (the mean
   breaks ties between units peaking alike in favour of the one the query attends to throughout).
2. Units first by whether the strategy's selection touches them (any of their tokens is among
   `tokens`), then by score, highest first; ties by the earlier unit.
3. Whole units are kept in that order while they fit the budget left after the sink. The first unit
   that does not fit is trimmed to the tokens left: the contiguous window of that many tokens around
   its best token. So every kept unit is whole but at most one, and exactly `len(tokens)` context
   tokens are kept (the budget, or the one the strategy chose), as with token selection.

With every unit one token, step 2 puts exactly the strategy's tokens first and step 3 keeps them
all: the result is the token selection itself.
"""

from __future__ import annotations

import torch

COVERAGE = 0.1  # the weight of a unit's mean score beside its best


def unit_scores(scores: torch.Tensor, bounds: torch.Tensor, coverage: float = COVERAGE) -> torch.Tensor:
    """scores (L,), bounds (U+1,) -> (U,) max + coverage x mean of each unit's scores."""
    sizes = torch.diff(bounds)
    members = torch.repeat_interleave(torch.arange(sizes.numel(), device=scores.device), sizes)
    values = scores[int(bounds[0]): int(bounds[-1])].float()
    best = torch.full((sizes.numel(),), -torch.inf, device=scores.device).scatter_reduce(0, members, values, "amax")
    total = torch.zeros(sizes.numel(), device=scores.device).index_add_(0, members, values)
    return best + coverage * total / sizes.clamp(min=1)


def select_units(scores: torch.Tensor, bounds: torch.Tensor, tokens: torch.Tensor, sink: int,
                 coverage: float = COVERAGE) -> torch.Tensor:
    """scores: (L,) a strategy's token scores; bounds: (U+1,) unit starts, 0 first and L last;
    tokens: (K,) the strategy's own kept indices (sink included); sink: the S leading tokens always kept.
    -> (K,) int64 kept indices, ascending: the sink, then whole units by the rule above."""
    length = scores.numel()
    device = scores.device
    budget = tokens.numel()
    sink = min(sink, budget, length)
    bounds = bounds.to(device)
    bounds = torch.unique(torch.cat((bounds.clamp(sink, length), torch.tensor([sink, length], device=device))))
    sizes = torch.diff(bounds)
    touched = torch.zeros(length, dtype=torch.bool, device=device)
    touched[tokens.to(device)] = True
    members = torch.repeat_interleave(torch.arange(sizes.numel(), device=device), sizes)
    hit = torch.zeros(sizes.numel(), dtype=torch.bool, device=device)
    hit[members[touched[sink:]]] = True
    ranked = unit_scores(scores, bounds, coverage)
    order = torch.sort(ranked, descending=True, stable=True).indices
    order = order[torch.sort(hit[order].to(torch.int8), descending=True, stable=True).indices]
    room = budget - sink
    fits = int(torch.searchsorted(torch.cumsum(sizes[order], 0), room, right=True))
    chosen = torch.zeros(sizes.numel(), dtype=torch.bool, device=device)
    chosen[order[:fits]] = True
    keep = torch.zeros(length, dtype=torch.bool, device=device)
    keep[:sink] = True
    keep[sink:] = chosen[members]
    left = room - int(sizes[order[:fits]].sum())
    if left > 0 and fits < order.numel():
        unit = int(order[fits])
        start, end = int(bounds[unit]), int(bounds[unit + 1])
        peak = start + int(torch.argmax(scores[start:end]))
        first = min(max(peak - left // 2, start), end - left)
        keep[first: first + left] = True
    return keep.nonzero().squeeze(1)
