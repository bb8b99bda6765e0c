"""One compression: token ids in, kept context indices out (the data path of the design)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..kernels.query_scores import query_key_scores
from ..models.llama import TruncatedLM
from .prefill import PrefillConfig, streaming_prefill
from .strategies import ScoreInputs, Strategy


@dataclass
class Selection:
    """kept: (B,) int64 ascending indices into the context; timings_ms: per stage;
    passthrough: True when the context already fit the budget and nothing ran."""

    kept: torch.Tensor
    timings_ms: dict[str, float] = field(default_factory=dict)
    passthrough: bool = False


def select_context(
    model: TruncatedLM | None,
    context_ids: torch.Tensor,
    query_ids: torch.Tensor,
    budget: int,
    strategy: Strategy,
    config: PrefillConfig,
) -> Selection:
    """Choose at most `budget` context tokens for the query.

    context_ids: (L,) int64, query_ids: (Lq,) int64. The first S (sink) tokens are always kept
    and count against the budget; the strategy allocates the other budget - S among the rest.
    `model` may be None for strategies that do not need attention.
    """
    length = context_ids.numel()
    if length <= budget:
        return Selection(torch.arange(length), passthrough=True)
    timings: dict[str, float] = {}
    clock = time.perf_counter()
    attention, state = None, None
    with torch.inference_mode():
        if strategy.needs_attention:
            if model is None:
                raise ValueError(f"strategy: {strategy.name} needs a model")
            state = streaming_prefill(model, context_ids, query_ids, config)
            timings["prefill"] = _lap(clock)
            clock = time.perf_counter()
            layer = model.n_layers
            attention = query_key_scores(state.queries[layer], state.keys[layer])
        scores = strategy.score(ScoreInputs(length=length, attention=attention, state=state))
        timings["score"] = _lap(clock)
        clock = time.perf_counter()
        sink = min(config.sink, budget)
        picked = strategy.allocate(scores[sink:], budget - sink) + sink
        kept = torch.cat((torch.arange(sink), picked.cpu()))
        timings["allocate"] = _lap(clock)
    return Selection(kept, timings)


def _lap(start: float) -> float:
    return round((time.perf_counter() - start) * 1000.0, 3)
