"""Choosing l_R (ILRe section 3.2, appendix A.1): whole-needle recall per layer, smallest best layer,
ties broken by the recall on long contexts (beyond the native window, DCA on, with distractors).

Pure functions over one streaming pass's keys and queries; the runner that builds samples, loops
and plots lives in evaluation/calibrate.py.
"""

from __future__ import annotations

import torch

from ..kernels.query_scores import query_key_scores
from .prefill import RetrievalState
from .strategies import Strategy


def needle_kept(kept: torch.Tensor, needle: tuple[int, int]) -> bool:
    """True when every token index in [start, end) is among `kept` (B,) indices."""
    return bool(torch.isin(torch.arange(*needle), kept).all())


def recall_by_layer(
    state: RetrievalState, needle: tuple[int, int], budget: int, sink: int, strategies: dict[str, Strategy]
) -> dict[str, dict[int, bool]]:
    """For each strategy and score layer of `state`: is the whole needle kept at `budget`?

    Scores every layer from the same pass (keys (kv, L, d) and queries (heads, Lq, d) per layer).
    """
    out: dict[str, dict[int, bool]] = {name: {} for name in strategies}
    for layer, keys in state.keys.items():
        scores = query_key_scores(state.queries[layer], keys)  # (L,)
        for name, strategy in strategies.items():
            picked = strategy.allocate(scores[sink:], budget - sink) + sink
            kept = torch.cat((torch.arange(sink), picked))
            out[name][layer] = needle_kept(kept, needle)
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
