"""Choosing l_R (ILRe section 3.2, appendix A.1): whole-needle recall per layer, smallest best layer,
ties broken by the recall on long contexts (beyond the native window, DCA on, with distractors).

Pure functions over one streaming pass's keys and queries; the runner that builds samples, loops
and plots lives in training/calibrate.py.
"""

from __future__ import annotations

import torch

import math

from ..kernels.query_scores import query_key_scores
from .allocation import PoolingAllocator
from .context_state import RetrievalState
from .prefill_config import PrefillConfig
from .strategies import Strategy
from .cascade_reading import pick_candidates, recent_share

CANDIDATE_FACTORS = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0)  # candidates per budget token the cascade's calibration weighs
COST_CAP = 1.3  # the cascade's prefill at most this much of plain ILRe at the coarse layer


def needle_kept(kept: torch.Tensor, needle: tuple[int, int]) -> bool:
    """True when every token index in [start, end) is among `kept` (B,) indices."""
    return bool(torch.isin(torch.arange(*needle), kept).all())


def recall_by_layer(
    state: RetrievalState, needle: tuple[int, int], budget: int, sink: int, strategies: dict[str, Strategy]
) -> dict[str, dict[int, bool]]:
    """For each strategy and score layer of `state`: is the whole needle kept at `budget`?

    Scores every layer from the same pass (keys (kv, L, d) and queries (heads, Lq, d) per layer) and
    keeps what the strategy's own `select` keeps from those scores: the engine's selection at that
    layer, from one pass instead of one per layer (tests/compressor/test_calibration.py checks each).
    """
    out: dict[str, dict[int, bool]] = {name: {} for name in strategies}
    for layer, keys in state.keys.items():
        scores = query_key_scores(state.queries[layer], keys)  # (L,)
        for name, strategy in strategies.items():
            out[name][layer] = needle_kept(strategy.select(scores, budget, sink).cpu(), needle)
    return out


def pick_layer(recall: dict[int, float]) -> int:
    """The smallest layer among those with the highest recall."""
    best = max(recall.values())
    return min(layer for layer, value in recall.items() if value == best)


CHOICES = ("fast", "default", "robust")


def pick_layers(short: dict[int, float], long: dict[int, float] | None = None) -> dict[str, int]:
    """The profile's named layers from per-layer recall on short contexts and, if measured, on long ones.

    fast: the smallest layer with the best short-context recall (the paper's rule); default: among
    the layers tied at the best short-context recall, the best long-context recall (then the
    smallest); robust: the best long-context recall of any layer (ties: the best short-context
    recall, then the smallest). Without long-context recall all three are `fast`."""
    fast = pick_layer(short)
    if not long:
        return dict.fromkeys(CHOICES, fast)
    best_short = max(short.values())
    tied = [l for l, v in short.items() if v == best_short]
    default = min(tied, key=lambda l: (-long.get(l, 0.0), l))
    robust = min(long, key=lambda l: (-long[l], -short.get(l, 0.0), l))
    return {"fast": fast, "default": default, "robust": robust}


def candidate_hits(state: RetrievalState, needle: tuple[int, int], budget: int, config: PrefillConfig, coarse: int,
                   factors: tuple[float, ...], allocator: PoolingAllocator) -> dict[float, bool]:
    """For each candidate factor: is the whole needle among the cascade's candidates picked by layer
    `coarse`'s attention (the sink, the recent tokens, Algorithm 1 at factor x budget)?"""
    scores = query_key_scores(state.queries[coarse], state.keys[coarse])  # (L,)
    out = {}
    for factor in factors:
        count = math.ceil(factor * budget)
        kept = pick_candidates(scores, count, config.sink, recent_share(count, config), allocator)
        out[factor] = needle_kept(kept.cpu(), needle)
    return out


def cascade_cost(coarse: int, l_r: int, factor: float, budget: int, length: int) -> float:
    """The cascade's prefill relative to plain ILRe at the coarse layer on `length` tokens, counted in
    layer-tokens: coarse layers over the context, l_R layers over its factor x budget candidates."""
    return (coarse * length + l_r * min(length, math.ceil(factor * budget))) / (coarse * length)


def pick_candidate_factor(costs: dict[float, float], cap: float = COST_CAP) -> float:
    """The largest factor whose cost stays within `cap` (the smallest factor when none does)."""
    within = [f for f, cost in costs.items() if cost <= cap]
    return max(within) if within else min(costs)
