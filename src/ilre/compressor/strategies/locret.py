"""Locret ("Enhancing Eviction ... with Trained Retaining Heads"): a learnt score, chunked eviction with stabilisers.

Query-agnostic: the head reads each context token's own q/k/v at l_R (before RoPE) during the
prefill (the `retaining` context part, models/retaining_head.py), so the scores are computed once
per encoded document and serve every later question (memoised on the ContextState).

Algorithm 1 (Locret inference), as implemented on the scores (readings marked *):
- the last n_loc tokens ("local") are never evicted; the rest is walked in chunks of B tokens;
- after each chunk joins the cache, and unless it is the last chunk, the cache's last n_s units
  ("stabilisers") get +inf on a copy of the scores; then the top b stay (ties: lower index), b =
  budget - n_loc, so budget tokens come back exactly; an evicted token never returns;
- * the pipeline's sink tokens count as +inf (always cached), as every strategy here keeps them;
- * heads: the head predicts one score per KV head; token IDs need one set, so they are maxed
  (`heads="max"`, default, as the paper's label takes the max over a group's heads) or summed;
- defaults scaled to the budget from the paper's Llama-3.1-8B row of Table 9 (b 16384, B 1024,
  n_s 2500, n_loc 100): n_s = 0.153 x budget, n_loc = budget / 164 (at least 1), B = budget / 16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .base import ScoreInputs, Strategy, check_int

PAPER_BUDGET, PAPER_CHUNK, PAPER_STABILISERS, PAPER_LOCAL = 16384, 1024, 2500, 100


def chunked_eviction(scores: torch.Tensor, budget: int, local: int, stabilisers: int, chunk: int) -> torch.Tensor:
    """Algorithm 1 over fixed scores (L,) (+inf = never evicted) -> (budget,) kept indices, ascending.
    One top-b per chunk of `chunk` tokens over the cache and the chunk; no per-token loop."""
    length = scores.numel()
    local = min(local, budget)
    cap, end = budget - local, length - local
    cache = torch.empty(0, dtype=torch.int64, device=scores.device)
    for start in range(0, end, chunk):
        stop = min(end, start + chunk)
        candidates = torch.cat((cache, torch.arange(start, stop, device=scores.device)))
        if candidates.numel() > cap:
            ranked = scores[candidates].clone()
            if stop < end and stabilisers:
                ranked[-stabilisers:] = math.inf
            order = torch.sort(ranked, descending=True, stable=True).indices[:cap]  # ties: earlier (lower index)
            candidates = candidates[order].sort().values
        cache = candidates
    return torch.cat((cache, torch.arange(end, length, device=scores.device)))


@dataclass(frozen=True)
class Locret(Strategy):
    """Options (null = scaled to the budget as in the module docstring): stabilisers (n_s), local
    (n_loc), chunk (B), heads ("max" or "sum" over KV heads)."""

    name = "locret"
    needs_query = False
    context_parts = ("retaining",)
    stabilisers: int | None = None
    local: int | None = None
    chunk: int | None = None
    heads: str = "max"

    def __post_init__(self) -> None:
        check_int("stabilisers", self.stabilisers, 0)
        check_int("local", self.local, 0)
        check_int("chunk", self.chunk, 1)
        if self.heads not in ("max", "sum"):
            raise ValueError(f"heads: must be max or sum (got {self.heads!r})")

    def sizes(self, budget: int) -> tuple[int, int, int]:
        """(stabilisers, local, chunk) for a budget: the options, or the paper's scaled."""
        stabilisers = self.stabilisers if self.stabilisers is not None else round(budget * PAPER_STABILISERS / PAPER_BUDGET)
        local = self.local if self.local is not None else max(1, round(budget * PAPER_LOCAL / PAPER_BUDGET))
        chunk = self.chunk if self.chunk is not None else max(1, round(budget * PAPER_CHUNK / PAPER_BUDGET))
        return stabilisers, local, chunk

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        """(L,) float32: the retaining head's predictions, max (or sum) over KV heads."""
        predicted = inputs.state.parts["retaining"][..., 0].float()  # (KV, L)
        return predicted.amax(dim=0) if self.heads == "max" else predicted.sum(dim=0)

    def select(self, scores: torch.Tensor, budget: int, sink: int) -> torch.Tensor:
        stabilisers, local, chunk = self.sizes(budget)
        sink = min(sink, budget)
        ranked = scores.clone()
        ranked[:sink] = math.inf
        return chunked_eviction(ranked, budget, min(local, budget - sink), stabilisers, chunk)

    def budget_split(self, budget: int) -> list[tuple[str, int]]:
        stabilisers, local, chunk = self.sizes(budget)
        return [(f"the last {local} tokens (local)", local),
                (f"chunked eviction by the retaining head's scores (chunks of {chunk}, the last {stabilisers} "
                 "of the cache protected after each)", budget - local)]
