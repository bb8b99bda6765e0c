"""Keeping whole units (compressor/units.py) instead of single tokens, for any strategy.

The rule, with `tokens` the strategy's own token selection at the budget (Algorithm 1's pooled spans
for ILRe and the cascade, top-k, partitions or chunks for the others):

1. Units the strategy's selection touches (any of their tokens among `tokens`) come first.
2. Among them, and then among the others: the share of the unit's tokens that the selection keeps
   plus the unit's peak, its best token score over the context's best, where a unit's peak is at
   least half its neighbour's on either side; ties go to the earlier unit. The share favours the unit
   Algorithm 1 kept most of (the record holding the answer, not the one that merely mentions a word
   of the question); the peak favours the unit the query points at, and its neighbour's half keeps
   the two pieces of a sentence cut at the cap together (a UUID key and its UUID value).
3. Whole units are kept in that order while they fit the budget left after the sink. The first unit
   that does not fit is trimmed to the tokens left: the contiguous window of that many tokens around
   its best token. So every kept unit is whole but at most one, and exactly `len(tokens)` context
   tokens are kept (the budget, or the one the strategy chose), as with token selection.

Measured on the cascade's scores (16K, 12 tasks, real files; results/eval/notes.md): the best score
alone lost needles cut in two at the cap, the share alone lost a long table row whose version the
token selection kept as a fragment; together they lost neither. With every unit one token, step 1
puts exactly the strategy's tokens first and step 3 keeps them: the result is the token selection.
"""

from __future__ import annotations

import torch


def unit_peaks(scores: torch.Tensor, members: torch.Tensor, units: int) -> torch.Tensor:
    """scores (L',) and each token's unit (L',) -> (U,) each unit's best score scaled to [0, 1] (0 = the lowest
    best or 0, whichever is lower; 1 = the best of all), at least half its neighbour's on either side."""
    best = torch.zeros(units, device=scores.device).scatter_reduce(0, members, scores.float(), "amax", include_self=False)
    low = best.min().clamp(max=0.0)
    best = (best - low) / (best.max() - low).clamp(min=torch.finfo(torch.float32).tiny)
    beside = torch.zeros(units + 2, device=scores.device)
    beside[:-2] = best
    beside[2:] = torch.maximum(beside[2:], best)
    return torch.maximum(best, 0.5 * beside[1:-1])


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
    kept_count = torch.zeros(units, device=device).index_add_(0, members, chosen_tokens[sink:])
    order = torch.sort(kept_count.gt(0).float() * 4 + kept_count / sizes + unit_peaks(scores[sink:], members, units),
                       descending=True, stable=True).indices
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
