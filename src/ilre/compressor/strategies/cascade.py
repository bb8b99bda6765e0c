"""The cascade: ILRe's scoring at l_R with a shallow layer's attention blended in, read through the cascade's plan.

This module is the strategy as a request names it (its options, validated once) and its scoring and allocation
(l_R's attention blended with the coarse layer's, Algorithm 1); how it reads the context (the coarse layer's
candidates run on to l_R, the fallback to the whole context) is its reading plan, compressor/cascade_reading.py.
Without a coarse layer, or where its candidates would cover the context (`whole`), it is plain ILRe at l_R with the
coarse layer blended in.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from ...kernels.query_scores import blend_layers, query_key_scores
from ..allocation import PoolingAllocator
from ..cascade_reading import DEFAULT_CANDIDATES, CascadeReading
from ..reading import Reading
from .base import ScoreInputs, Strategy, check_int

DEFAULT_COARSE_WEIGHT = 0.5  # the coarse layer's weight beside l_R's when neither the request nor the profile says


@dataclass(frozen=True)
class Cascade(Strategy):
    """coarse_layer: l_c < l_R, whose query attention over the whole context picks the candidates
    (None: none, i.e. plain ILRe at l_R; a model's profile supplies the calibrated one);
    candidates: how many candidates per budget token (>= 1; None: the profile's, else 4);
    coarse_weight: in [0, 1], the coarse layer's attention joins l_R's at this weight (each scaled to
    sum 1 outside the sink, element-wise max, as ILRe's also_layers; 0 = l_R alone; None: the profile's,
    else 0.5);
    deepen_below: in [0, 1]; when `peak_strength` of l_R's attention over the candidates (outside the
    sink) is below it, the whole context runs to l_R and the query is scored as `deepened()` scores it
    (None: the profile's, else 0 = never);
    deepen_blend: in [0, 1]; when it falls back, l_R's attention over the candidates joins the whole
    context's at this weight (each scaled to sum 1 outside the sink, element-wise max), so what the
    candidates found stays in reach (None: the profile's, else 0 = the whole context's alone);
    coarse_below: in [0, 1]; when `peak_strength` of the coarse layer's own attention over the context
    (outside the sink) is below it, the candidate pass is skipped and the whole context runs to l_R at once,
    scored as `deepened()` scores it: decided before any l_R work, so such a query costs what plain ILRe at
    l_R costs once the caller resumes the coarse encoding (None: the profile's, else 0 = never);
    first_from_stream: whether a document's first question runs its candidates on from the residual stream
    the coarse pass leaves entering l_c (layers l_c..l_R over C), as its later questions do, rather than from
    layer 1 (None: the profile's, else True; contexts longer than FIRST_STREAM_TOKENS start at layer 1, the
    stream being L x D for the request);
    max_kernels / avg_kernels: Algorithm 1's kernels, at both stages; whole: set by the plan's `for_context`
    when the candidates would cover the context, which then runs as ILRe at l_R with the coarse
    layer in also_layers. How the candidates are read: compressor/cascade_reading.py."""

    name = "cascade"
    coarse_layer: int | None = None
    candidates: float | None = None
    coarse_weight: float | None = None
    deepen_below: float | None = None
    deepen_blend: float | None = None
    coarse_below: float | None = None
    first_from_stream: bool | None = None
    max_kernels: tuple[int, ...] = (2, 4, 8)
    avg_kernels: tuple[int, ...] = tuple(range(1, 17))
    whole: bool = field(default=False, repr=False, metadata={"internal": True})
    allocator: PoolingAllocator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_int("coarse_layer", self.coarse_layer, 1)
        if self.first_from_stream is not None and not isinstance(self.first_from_stream, bool):
            raise ValueError(f"first_from_stream: must be true, false or null (got {self.first_from_stream!r})")
        for name, value, low in (("candidates", self.candidates, 1), ("coarse_weight", self.coarse_weight, 0),
                                 ("deepen_below", self.deepen_below, 0), ("deepen_blend", self.deepen_blend, 0),
                                 ("coarse_below", self.coarse_below, 0)):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < low:
                what = "the candidate set as a multiple of the budget" if name == "candidates" else "at most 1"
                raise ValueError(f"{name}: must be a number >= {low}, {what} (got {value!r})")
            if name != "candidates" and value > 1:
                raise ValueError(f"{name}: must be a number in [0, 1] (got {value!r})")
        object.__setattr__(self, "allocator", PoolingAllocator(self.max_kernels, self.avg_kernels))

    @property
    def weight(self) -> float:
        """coarse_weight as it applies: the request's, else the profile's, else DEFAULT_COARSE_WEIGHT."""
        return DEFAULT_COARSE_WEIGHT if self.coarse_weight is None else self.coarse_weight

    @property
    def cascade_layer(self) -> int | None:
        """The layer whose attention picks the candidates; None when every token is a candidate."""
        return None if self.whole else self.coarse_layer

    @property
    def extra_layers(self) -> tuple[int, ...]:
        blended = self.whole and self.coarse_layer is not None and self.weight > 0
        return (self.coarse_layer,) if blended else ()

    def reading(self) -> Reading:
        """Plain ILRe's reading without a coarse layer (or whole); else the candidate pass (CascadeReading) around
        this strategy's scoring, its deepened form every token a candidate (ILRe at l_R with the coarse layer at
        coarse_weight, stage 18 of the results page)."""
        if self.cascade_layer is None:
            return Reading(self)
        return CascadeReading(self, self.coarse_layer, self.candidates or DEFAULT_CANDIDATES, self.deepen_below or 0.0,
                              self.deepen_blend or 0.0, self.coarse_below or 0.0, self.first_from_stream is not False,
                              self.allocator, dataclasses.replace(self, whole=True))

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        """l_R's A^C (over the candidates, or on the whole context over all) blended with the coarse
        layer's at coarse_weight."""
        coarse = inputs.coarse_attention
        if coarse is None and self.extra_layers:
            state = inputs.state
            coarse = query_key_scores(state.queries[self.coarse_layer], state.keys[self.coarse_layer])
        if coarse is None or self.weight == 0:
            return inputs.attention
        return blend_layers(inputs.attention, [coarse], self.weight, inputs.sink)

    def allocate(self, scores: torch.Tensor, budget: int) -> torch.Tensor:
        return self.allocator.allocate(scores, budget)

    def budget_split(self, budget: int) -> list[tuple[str, int]]:
        return self.allocator.split(budget)
