"""ReAttention: position-agnostic top-k over pre-RoPE q.k, votes, spans (arXiv 2407.15176, section 3).

The query and the context keys are taken at the retrieval layer BEFORE the rotary step (the prefill
keeps them as the `raw_keys` / `raw_queries` parts), so a token's score does not fade with its
distance from the query: the point of the method, where ILRe's post-RoPE attention may.

As implemented for a token-ID output (readings marked *; the paper's pseudocode has known bugs):
- global (the first G tokens, at least the pipeline's sink) and local (the last L_loc tokens) are
  always kept; the middle between them is searched;
- every query head h and query token t ranks the middle by q_ht . k_j (KV head h // group, no key
  repeated) and takes its top k, ties by lower index; * votes are ranks (Borda): rank r of k gives
  k - r points, summed over heads and query tokens;
- the winners, by votes (ties by lower index), each bring a span of `span` tokens centred on them
  (* [w - span//2, w - span//2 + span) within the middle, nearest tokens first), at most k' winners;
  overlaps are merged and the first budget - G - L_loc new tokens taken, so the budget is met
  exactly; * if the spans run out first, the most recent middle tokens fill the rest;
- defaults scaled to the budget B from the paper's 8192-token scope (global 32, local 4096, span
  32, k 4, k' 127): global = max(sink, B/256), local = B/2, span 32, k 4, k' as many as fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .base import ScoreInputs, Strategy, check_int

KEY_BLOCK = 8192  # keys scored at once: one (kv_heads, group * Lq, block) block of dot products


def borda_votes(raw_q: torch.Tensor, raw_k: torch.Tensor, lo: int, hi: int, k: int) -> torch.Tensor:
    """raw_q: (heads, Lq, d), raw_k: (kv_heads, L, d) pre-RoPE -> (L,) float32 votes: each (head,
    query token) gives k - r points to its r-th best middle token in [lo, hi) (ties by lower index)."""
    n_heads, n_query, dim = raw_q.shape
    n_kv, length, _ = raw_k.shape
    rows = n_heads // n_kv * n_query
    q = raw_q.float().reshape(n_kv, rows, dim)
    best_vals = torch.empty(n_kv, rows, 0, device=raw_q.device)
    best_idx = torch.empty(n_kv, rows, 0, dtype=torch.int64, device=raw_q.device)
    for start in range(lo, hi, KEY_BLOCK):
        end = min(hi, start + KEY_BLOCK)
        logits = q @ raw_k[:, start:end].float().transpose(1, 2)  # (KV, rows, blk)
        vals, order = torch.sort(logits, dim=-1, descending=True, stable=True)
        vals = torch.cat((best_vals, vals[..., :k]), dim=-1)  # earlier blocks first: lower indices win ties
        idx = torch.cat((best_idx, order[..., :k] + start), dim=-1)
        keep = torch.sort(vals, dim=-1, descending=True, stable=True).indices[..., :k]
        best_vals, best_idx = vals.gather(-1, keep), idx.gather(-1, keep)
    votes = torch.zeros(length, dtype=torch.float32, device=raw_q.device)
    points = (k - torch.arange(best_idx.shape[-1], device=raw_q.device, dtype=torch.float32)).expand_as(best_vals)
    return votes.scatter_add_(0, best_idx.flatten(), points.flatten())


def first_occurrences(flat: torch.Tensor) -> torch.Tensor:
    """(N,) int64 -> the entries seen for the first time, in order."""
    if not flat.numel():
        return flat
    unique, inverse = torch.unique(flat, return_inverse=True)
    positions = torch.arange(flat.numel(), device=flat.device)
    first = torch.full((unique.numel(),), flat.numel(), device=flat.device).scatter_reduce(0, inverse, positions, "amin")
    return flat[first[inverse] == positions]


@dataclass(frozen=True)
class ReAttention(Strategy):
    """Options (null = scaled to the budget as in the module docstring): global_tokens,
    local_tokens, span (32), k (4 per head and query token), k_prime (winners; null = as many as the
    budget holds)."""

    name = "reattention"
    context_parts = ("raw_keys",)
    query_parts = ("raw_queries",)
    global_tokens: int | None = None
    local_tokens: int | None = None
    span: int = 32
    k: int = 4
    k_prime: int | None = None

    def __post_init__(self) -> None:
        check_int("global_tokens", self.global_tokens, 0)
        check_int("local_tokens", self.local_tokens, 0)
        check_int("k_prime", self.k_prime, 1)
        check_int("span", self.span, 1, optional=False)
        check_int("k", self.k, 1, optional=False)

    def regions(self, length: int, budget: int, sink: int) -> tuple[int, int]:
        """(G, L_loc): the global and local token counts for this budget (G + L_loc <= budget)."""
        glob = self.global_tokens if self.global_tokens is not None else max(sink, math.ceil(budget / 256))
        glob = min(max(glob, sink), budget, length)
        local = self.local_tokens if self.local_tokens is not None else budget // 2
        return glob, min(local, budget - glob)

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        """(L,) votes of the middle tokens; +inf for the global and local tokens."""
        glob, local = self.regions(inputs.length, inputs.budget, inputs.sink)
        parts = inputs.state.parts
        votes = borda_votes(parts["raw_queries"], parts["raw_keys"], glob, inputs.length - local, self.k)
        votes[:glob] = math.inf
        votes[inputs.length - local:] = math.inf
        return votes

    def select(self, scores: torch.Tensor, budget: int, sink: int) -> torch.Tensor:
        length, device = scores.numel(), scores.device
        glob, local = self.regions(length, budget, sink)
        lo, hi, room = glob, length - local, budget - glob - local
        middle = scores[lo:hi]
        ranked = torch.sort(middle, descending=True, stable=True).indices
        winners = ranked[: int((middle > 0).sum())] + lo
        if self.k_prime is not None:
            winners = winners[: self.k_prime]
        offsets = torch.arange(self.span, device=device) - self.span // 2
        nearest = offsets[torch.sort(offsets.abs() * 2 + (offsets > 0), stable=True).indices]  # 0, -1, 1, -2, ...
        spans = (winners.unsqueeze(1) + nearest).flatten()
        spans = spans[(spans >= lo) & (spans < hi)]
        picked = first_occurrences(spans)[:room]
        if picked.numel() < room:  # spans ran out: the most recent middle tokens fill the rest
            taken = torch.zeros(hi - lo, dtype=torch.bool, device=device)
            taken[picked - lo] = True
            recent = torch.arange(hi - 1, lo - 1, -1, device=device)
            picked = torch.cat((picked, recent[~taken.flip(0)][: room - picked.numel()]))
        kept = torch.cat((torch.arange(glob, device=device), picked, torch.arange(hi, length, device=device)))
        return kept.sort().values

    def budget_split(self, budget: int) -> list[tuple[str, int]]:
        local = self.local_tokens if self.local_tokens is not None else budget // 2
        return [("global and local tokens (first and last), always", min(budget, local)),
                (f"spans of {self.span} around the most voted middle tokens", max(0, budget - local))]
