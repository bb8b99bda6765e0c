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
3. Whole units are kept in that order while they fit the budget left after the sink. A table row
   (a unit with a header, compressor/table_headers.py) brings its table's header the first time a unit
   of that table is kept, and the header's tokens count against the budget there; a header unit kept
   for itself brings the rest of the header. The first unit that does not fit is trimmed to the tokens
   left: the contiguous window of that many tokens around its best token (a row that would fit without
   its header is kept whole with its header's first tokens). So every kept unit is whole but at most
   one, and exactly `len(tokens)` context tokens are kept (the budget, or the one the strategy chose),
   as with token selection.

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


def select_units(scores: torch.Tensor, bounds: torch.Tensor, tokens: torch.Tensor, sink: int,
                 heads: torch.Tensor | None = None) -> torch.Tensor:
    """scores: (L,) a strategy's token scores; bounds: (U+1,) unit starts, 0 first and L last;
    tokens: (K,) the strategy's own kept indices (sink included); sink: the S leading tokens always kept;
    heads: (U, 2) each unit's table header as a token span of whole units, (-1, -1) for none (None: no table).
    -> (K,) int64 kept indices, ascending: the sink, then whole units (and their headers) by the rule above."""
    length = scores.numel()
    device = scores.device
    budget = tokens.numel()
    sink = min(sink, budget, length)
    edges = torch.tensor([sink, length], device=device)
    original = bounds.to(device)
    bounds = torch.unique(torch.cat((original.clamp(sink, length), edges)))
    sizes = torch.diff(bounds)
    units = sizes.numel()
    members = torch.repeat_interleave(torch.arange(units, device=device), sizes)
    chosen_tokens = torch.zeros(length, device=device)
    chosen_tokens[tokens.to(device)] = 1.0
    kept_count = torch.zeros(units, device=device).index_add_(0, members, chosen_tokens[sink:])
    order = torch.sort(kept_count.gt(0).float() * 4 + kept_count / sizes + unit_peaks(scores[sink:], members, units),
                       descending=True, stable=True).indices
    room = budget - sink
    keep = torch.zeros(length, dtype=torch.bool, device=device)
    keep[:sink] = True
    cost, head_span = sizes[order], None
    if heads is not None and units:
        cost, head_span = _with_headers(order, bounds, original, heads.to(device), sizes, sink)
    fits = int(torch.searchsorted(torch.cumsum(cost, 0), room, right=True))
    chosen = torch.zeros(units, dtype=torch.bool, device=device)
    chosen[order[:fits]] = True
    keep[sink:] = chosen[members]
    if head_span is not None:
        paid = head_span[:fits][head_span[:fits, 0] >= 0]  # the headers the kept units bring
        if paid.numel():
            edge = torch.zeros(length + 1, dtype=torch.int64, device=device)
            edge.index_add_(0, paid[:, 0], torch.ones(len(paid), dtype=torch.int64, device=device))
            edge.index_add_(0, paid[:, 1], -torch.ones(len(paid), dtype=torch.int64, device=device))
            keep |= torch.cumsum(edge, 0)[:length] > 0
    left = room - int(cost[:fits].sum())
    if left > 0 and fits < units:
        unit = int(order[fits])
        start, end = int(bounds[unit]), int(bounds[unit + 1])
        if head_span is not None and int(head_span[fits, 0]) >= 0 and end - start < left:
            # the unit fits without its header: the unit whole, and its header's first tokens
            keep[start:end] = True
            begin, stop = int(head_span[fits, 0]), int(head_span[fits, 1])
            rest = begin + torch.nonzero(~keep[begin:stop]).squeeze(1)[: left - (end - start)]
            keep[rest] = True
        else:
            peak = start + int(torch.argmax(scores[start:end]))
            first = min(max(peak - left // 2, start), end - left)
            keep[first: first + left] = True
    return keep.nonzero().squeeze(1)


def _with_headers(order: torch.Tensor, bounds: torch.Tensor, original: torch.Tensor, heads: torch.Tensor,
                  sizes: torch.Tensor, sink: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each ordered unit's cost with headers: its own tokens (none for a unit inside a header) plus, at
    the first unit of a table in `order`, its header's tokens after the sink. -> cost (U,) and the header
    span (U, 2) that position pays for, (-1, -1) where it pays for none. bounds: (U+1,) the units cut
    at the sink; original: the (U'+1,) bounds `heads` (U', 2) belong to."""
    starts = bounds[:-1][order]
    span = heads[torch.searchsorted(original, starts, right=True) - 1]  # (U, 2) each ordered unit's header
    span = torch.where(span[:, 1:] > sink, span.clamp(min=sink), torch.full_like(span, -1))  # a header in the sink is kept
    grouped = span[:, 0] >= 0
    inside = grouped & (starts >= span[:, 0]) & (starts < span[:, 1])
    cost = torch.where(inside, torch.zeros_like(starts), sizes[order])
    positions = torch.arange(order.numel(), device=order.device)
    table = torch.unique(torch.where(grouped, span[:, 0], -1), return_inverse=True)[1]  # one id per header
    first = torch.full((order.numel(),), order.numel(), dtype=torch.int64, device=order.device)
    first.scatter_reduce_(0, table, torch.where(grouped, positions, order.numel()), "amin")
    pays = grouped & (first[table] == positions)
    cost = cost + torch.where(pays, span[:, 1] - span[:, 0], torch.zeros_like(cost))
    return cost, torch.where(pays.unsqueeze(1), span, torch.full_like(span, -1))
