"""Keeping whole units (compressor/units.py) instead of single tokens, for any strategy.

The rule, with `tokens` the strategy's own token selection at the budget (Algorithm 1's pooled spans
for ILRe and the cascade, top-k, partitions or chunks for the others):

1. A unit's score is the share of its tokens that the strategy's selection keeps (Algorithm 1 keeps
   spans around the query's peaks: the unit holding a needle and its value is mostly kept, a unit
   that merely mentions a word of the question is touched at one spot); ties go to the unit with the
   best single token score, then to the earlier unit.
2. Whole units are kept in that order while they fit the budget left after the sink. The first unit
   that does not fit is trimmed to the tokens left: the contiguous window of that many tokens around
   its best token. So every kept unit is whole but at most one, and exactly `len(tokens)` context
   tokens are kept (the budget, or the one the strategy chose), as with token selection.

Measured against the unit's best score with a tenth of its mean beside it (units the selection
touches first): that rule lost needles split over two units (a UUID key and its UUID value), the
share keeps them (results/eval/notes.md). With every unit one token the kept units are exactly the
strategy's tokens: the result is the token selection itself.
"""

from __future__ import annotations

import torch


def select_units(scores: torch.Tensor, bounds: torch.Tensor, tokens: torch.Tensor, sink: int) -> torch.Tensor:
    """scores: (L,) a strategy's token scores; bounds: (U+1,) unit starts, 0 first and L last;
    tokens: (K,) the strategy's own kept indices (sink included); sink: the S leading tokens always kept.
    -> (K,) int64 kept indices, ascending: the sink, then whole units by the rule above."""
    length = scores.numel()
    device = scores.device
    budget = tokens.numel()
    sink = min(sink, budget, length)
    edges = torch.tensor([sink, length], device=device)
    bounds = torch.unique(torch.cat((bounds.to(device).clamp(sink, length), edges)))
    sizes = torch.diff(bounds)
    units = sizes.numel()
    members = torch.repeat_interleave(torch.arange(units, device=device), sizes)
    chosen_tokens = torch.zeros(length, device=device)
    chosen_tokens[tokens.to(device)] = 1.0
    share = torch.zeros(units, device=device).index_add_(0, members, chosen_tokens[sink:]) / sizes
    best = torch.full((units,), -torch.inf, device=device).scatter_reduce(0, members, scores[sink:].float(), "amax")
    order = torch.sort(best, descending=True, stable=True).indices
    order = order[torch.sort(share[order], descending=True, stable=True).indices]
    room = budget - sink
    fits = int(torch.searchsorted(torch.cumsum(sizes[order], 0), room, right=True))
    chosen = torch.zeros(units, dtype=torch.bool, device=device)
    chosen[order[:fits]] = True
    keep = torch.zeros(length, dtype=torch.bool, device=device)
    keep[:sink] = True
    keep[sink:] = chosen[members]
    left = room - int(sizes[order[:fits]].sum())
    if left > 0 and fits < units:
        unit = int(order[fits])
        start, end = int(bounds[unit]), int(bounds[unit + 1])
        peak = start + int(torch.argmax(scores[start:end]))
        first = min(max(peak - left // 2, start), end - left)
        keep[first: first + left] = True
    return keep.nonzero().squeeze(1)
