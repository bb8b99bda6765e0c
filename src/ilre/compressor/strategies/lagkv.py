"""LagKV: score each token by how far its K/V depart from the NEXT partition's range (arXiv 2504.04704).

Query-agnostic and attention-free: it reads the layer-l_R keys (post-RoPE, as the paper's code) and
values of the context, never the query, so one encoded document serves every later question with
the same scores (memoised on the ContextState).

Section 2.2, as implemented (readings of what the paper leaves open marked *):
- the first S tokens stay (S = max(sink option, the pipeline's sink));
- the rest is cut into partitions of L (lag) tokens counted from S; the last full partition and the
  L_s - S mod L tokens after it have no reference and stay (the "sliding window");
- for partition p, KV head i, Z in {K, V}: min/max per channel over partition p+1, Zbar = (Z_p -
  min) / (max - min + eps), std over channels (torch.std, as the paper's code), softmax over the
  partition's tokens; score = score(K) + score(V), in float32;
- * heads: the paper keeps a set per head; token IDs need one set, so the per-head scores are
  summed (`heads="sum"`, default) or maxed (`heads="max"`);
- selection is per partition, never a global top-k: with budget B, the B - S - window tokens left
  are shared over the partitions as evenly as integers allow (* the remainder goes to the
  partitions nearest the end), each keeping its best tokens (ties: lower index), so exactly B come
  back;
- * when fewer than two partitions fit, or B cannot hold the sink and the window, the paper
  compresses nothing; here the sink and the most recent B - S tokens are kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...kernels.rope import keys_as_read
from .base import ScoreInputs, Strategy

EPS = 1e-6
BLOCK_TOKENS = 1 << 15  # partitions scored at once: about this many tokens (bounded working memory)


@dataclass(frozen=True)
class Layout:
    """Where LagKV's parts of a context lie: sink [0, sink), n scored partitions of `lag` tokens
    from `sink`, then the window to the end (the last full partition and the remainder)."""

    sink: int
    lag: int
    n: int
    length: int

    @property
    def window(self) -> int:
        return self.length - self.sink - self.n * self.lag


def layout(length: int, sink: int, lag: int) -> Layout:
    """The partitions of a context of `length` tokens (n = 0 when fewer than two fit)."""
    full = max(0, length - sink) // lag
    return Layout(min(sink, length), lag, full - 1 if full >= 2 else 0, length)


def partition_scores(keys: torch.Tensor, values: torch.Tensor, lay: Layout, heads: str) -> torch.Tensor:
    """keys, values: (kv_heads, L, d) -> (n, lag) float32 scores of the scored partitions."""
    out = torch.empty(lay.n, lay.lag, dtype=torch.float32, device=keys.device)
    step = max(1, BLOCK_TOKENS // lay.lag)
    for first in range(0, lay.n, step):
        count = min(step, lay.n - first)
        start = lay.sink + first * lay.lag
        total = None
        for z in (keys, values):
            parts = z[:, start: start + (count + 1) * lay.lag].float().unflatten(1, (count + 1, lay.lag))
            ref = parts[:, 1:]  # (KV, count, lag, d): each partition's reference is the next one
            low, high = ref.amin(dim=2, keepdim=True), ref.amax(dim=2, keepdim=True)
            normed = (parts[:, :-1] - low) / (high - low + EPS)
            score = torch.softmax(normed.std(dim=-1), dim=-1)  # (KV, count, lag)
            total = score if total is None else total + score
        out[first: first + count] = total.sum(dim=0) if heads == "sum" else total.amax(dim=0)
    return out


def quotas(budget_left: int, n: int) -> torch.Tensor:
    """(n,) tokens each partition keeps: budget_left shared evenly, the remainder to the last ones."""
    base, extra = divmod(budget_left, n)
    quota = torch.full((n,), base, dtype=torch.int64)
    if extra:
        quota[n - extra:] += 1
    return quota


@dataclass(frozen=True)
class LagKV(Strategy):
    """Options: sink (S, default 16 as the paper's code; at least the pipeline's sink), lag (L,
    default 128 as in the paper's RULER runs), heads ("sum" or "max" over KV heads)."""

    name = "lagkv"
    needs_query = False
    context_parts = ("values",)
    sink: int = 16
    lag: int = 128
    heads: str = "sum"

    def __post_init__(self) -> None:
        for name in ("sink", "lag"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "sink" else 1):
                raise ValueError(f"{name}: must be an integer >= {0 if name == 'sink' else 1} (got {value!r})")
        if self.heads not in ("sum", "max"):
            raise ValueError(f"heads: must be sum or max (got {self.heads!r})")

    def _layout(self, length: int, sink: int) -> Layout:
        return layout(length, max(self.sink, sink), self.lag)

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        """(L,) scores: +inf for the sink and the window, each scored partition's LagKV scores."""
        keys = keys_as_read(inputs.state.keys[max(inputs.state.keys)])  # as the query reads them (DCA moved)
        lay = self._layout(inputs.length, inputs.sink)
        scores = torch.full((inputs.length,), math.inf, dtype=torch.float32, device=keys.device)
        if lay.n:
            values = inputs.state.parts["values"]
            scores[lay.sink: lay.sink + lay.n * lay.lag] = partition_scores(keys, values, lay, self.heads).flatten()
        return scores

    def select(self, scores: torch.Tensor, budget: int, sink: int) -> torch.Tensor:
        length = scores.numel()
        lay = self._layout(length, sink)
        left = budget - lay.sink - lay.window
        if lay.n == 0 or left < 0:  # nothing to partition, or no room for the window: sink + most recent
            head = min(lay.sink, budget)
            return torch.cat((torch.arange(head), torch.arange(length - (budget - head), length))).to(scores.device)
        quota = quotas(left, lay.n).to(scores.device)
        grid = scores[lay.sink: lay.sink + lay.n * lay.lag].view(lay.n, lay.lag)
        order = torch.sort(grid, dim=1, descending=True, stable=True).indices  # best first, ties by index
        take = torch.arange(lay.lag, device=scores.device).unsqueeze(0) < quota.unsqueeze(1)
        rows = torch.arange(lay.n, device=scores.device).unsqueeze(1).expand_as(order)
        picked = (lay.sink + rows * lay.lag + order)[take]
        window = torch.arange(length - lay.window, length, device=scores.device)
        return torch.cat((torch.arange(lay.sink, device=scores.device), picked.sort().values, window))

    def budget_split(self, budget: int) -> list[tuple[str, int]]:
        return [(f"partitions of {self.lag} tokens, each its share by LagKV score; the last partition and "
                 "the remainder kept whole", budget)]
