"""ActQKV ("Activation-aware Probe-Query"): a probe query, cosine retrieval in chunks, an entropy-sized budget.

The paper's equation bodies were lost from its text; this is the reconstruction of its prose
(section 4), with what it leaves open marked *:
- window (eq. 7-8): * the query chunk at l_R (in ilre the question follows the whole context, so
  it is the last window ActQKV would probe with); its query vectors are taken BEFORE RoPE, so
  vectors from different positions are not mixed in phase; the first `skip` tokens (template,
  BOS) can be left out;
- activation bias (eq. 7): per query head h and token j, phi_j = mean over channels c of
  (q_jc - mu_c)^2 / (sigma^2_c + eps), mu and sigma^2 the window's per-channel mean and variance,
  eps = mean(sigma^2) / 100 (so near-constant channels do not dominate), in float32;
- probe (eq. 9): q_hat_h = sum_j phi_j q_j / sum_j phi_j (uniform weights when every phi is 0,
  e.g. a one-token window); * the question folded in: q_hat + question_weight x the window's mean
  query vector, each normalised (question_weight 0, the default, is the activation probe alone:
  the window here IS the question);
- retrieval (eq. 10): each context token's score is the mean over query heads of
  cos(q_hat_h, k_j) with the pre-RoPE key of h's KV head; * chunks of `chunk` tokens (32, the
  paper's) score their best token; after the sink and the local tail, whole chunks are taken best
  first, the last one cut to its best tokens, so the budget is met exactly;
- layout scaled to the budget B from the paper's 2048 (64 sink + 512 local + 46 x 32 retrieved):
  sink max(pipeline's, B/32), local B/4, the rest retrieved;
- dynamic cut-off (section 4.2, eq. 11-12) with `auto_budget`: the information density D =
  entropy(softmax(s / temperature)) / log N over the N retrievable tokens' scores s; the budget
  is min_budget + D x (B - min_budget), rounded: flatter scores keep more. * The paper shares a
  total over layers in proportion to D; one retrieval layer has nothing to share with, so D maps
  the request's budget (the most) down to `min_budget` (default B/4). * temperature 0.02: at 1,
  cosines in [-1, 1] give a softmax so flat that D is ~1 for every context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .base import ScoreInputs, Strategy, check_int

PAPER_BUDGET, PAPER_SINK, PAPER_LOCAL = 2048, 64, 512


def activation_bias(window: torch.Tensor) -> torch.Tensor:
    """window: (heads, n, d) query vectors -> (heads, n) float32 phi (eq. 7-8)."""
    q = window.float()
    mean = q.mean(dim=1, keepdim=True)
    var = q.var(dim=1, unbiased=False, keepdim=True)
    eps = var.mean(dim=-1, keepdim=True) / 100.0 + 1e-12
    return ((q - mean).pow(2) / (var + eps)).mean(dim=-1)


def probe_query(raw_queries: torch.Tensor, skip: int = 0, question_weight: float = 0.0) -> torch.Tensor:
    """raw_queries: (heads, Lq, d) pre-RoPE -> (heads, d) float32 probe (eq. 9, question folded in)."""
    window = raw_queries[:, min(skip, raw_queries.shape[1] - 1):].float()
    phi = activation_bias(window)
    total = phi.sum(dim=1, keepdim=True)
    weights = torch.where(total > 0, phi / total.clamp_min(1e-30), torch.full_like(phi, 1.0 / phi.shape[1]))
    probe = (weights.unsqueeze(-1) * window).sum(dim=1)
    if question_weight:
        unit = torch.nn.functional.normalize
        probe = unit(probe, dim=-1) + question_weight * unit(window.mean(dim=1), dim=-1)
    return probe


def cosine_scores(probe: torch.Tensor, raw_keys: torch.Tensor) -> torch.Tensor:
    """probe: (heads, d), raw_keys: (kv_heads, L, d) -> (L,) float32: mean over heads of cos(probe_h, k_j)."""
    n_heads, n_kv = probe.shape[0], raw_keys.shape[0]
    unit = torch.nn.functional.normalize
    p = unit(probe.float(), dim=-1).reshape(n_kv, n_heads // n_kv, -1)  # (KV, group, d)
    out = torch.zeros(raw_keys.shape[1], dtype=torch.float32, device=raw_keys.device)
    for kv in range(n_kv):  # one (group, L) block per KV head
        out += (p[kv] @ unit(raw_keys[kv].float(), dim=-1).T).sum(dim=0)
    return out / n_heads


def information_density(scores: torch.Tensor, temperature: float) -> float:
    """scores: (N,) -> entropy(softmax(scores / temperature)) / log N in [0, 1] (1 when N < 2)."""
    if scores.numel() < 2:
        return 1.0
    logp = torch.log_softmax(scores.double() / temperature, dim=0)
    return float(-(logp.exp() * logp).sum() / math.log(scores.numel()))


@dataclass(frozen=True)
class ActQKV(Strategy):
    """Options (null = scaled to the budget, see the module docstring): chunk (32), sink_tokens,
    local_tokens, skip (0), question_weight (0), auto_budget (false), min_budget, temperature (0.02)."""

    name = "actqkv"
    context_parts = ("raw_keys",)
    query_parts = ("raw_queries",)
    chunk: int = 32
    sink_tokens: int | None = None
    local_tokens: int | None = None
    skip: int = 0
    question_weight: float = 0.0
    auto_budget: bool = False
    min_budget: int | None = None
    temperature: float = 0.02

    def __post_init__(self) -> None:
        check_int("chunk", self.chunk, 1)
        check_int("sink_tokens", self.sink_tokens, 0)
        check_int("local_tokens", self.local_tokens, 0)
        check_int("skip", self.skip, 0)
        check_int("min_budget", self.min_budget, 1)
        if isinstance(self.question_weight, bool) or not isinstance(self.question_weight, (int, float)) \
                or not self.question_weight >= 0:
            raise ValueError(f"question_weight: must be a number >= 0 (got {self.question_weight!r})")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or not self.temperature > 0:
            raise ValueError(f"temperature: must be a number > 0 (got {self.temperature!r})")
        if not isinstance(self.auto_budget, bool):
            raise ValueError(f"auto_budget: must be true or false (got {self.auto_budget!r})")

    def regions(self, length: int, budget: int, sink: int) -> tuple[int, int]:
        """(sink, local) token counts for this budget, sink + local <= budget."""
        head = self.sink_tokens if self.sink_tokens is not None else max(sink, round(budget * PAPER_SINK / PAPER_BUDGET))
        head = min(max(head, sink), budget, length)
        local = self.local_tokens if self.local_tokens is not None else round(budget * PAPER_LOCAL / PAPER_BUDGET)
        return head, min(local, budget - head, length - head)

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        """(L,) the probe's mean cosine to each context key (sink and local tail included)."""
        parts = inputs.state.parts
        return cosine_scores(probe_query(parts["raw_queries"], self.skip, self.question_weight), parts["raw_keys"])

    def chosen_budget(self, scores: torch.Tensor, budget: int, sink: int) -> int:
        """The budget to keep: `budget`, or with auto_budget the entropy-sized one in [min_budget, budget]."""
        if not self.auto_budget:
            return budget
        head, local = self.regions(scores.numel(), budget, sink)
        low = min(self.min_budget if self.min_budget is not None else max(1, budget // 4), budget)
        density = information_density(scores[head: scores.numel() - local], self.temperature)
        return max(low, min(budget, low + round(density * (budget - low))))

    def select(self, scores: torch.Tensor, budget: int, sink: int) -> torch.Tensor:
        budget = self.chosen_budget(scores, budget, sink)
        length, device = scores.numel(), scores.device
        head, local = self.regions(length, budget, sink)
        lo, hi, room = head, length - local, budget - head - local
        middle = scores[lo:hi]
        n_chunks = math.ceil(middle.numel() / self.chunk)
        padded = torch.full((n_chunks * self.chunk,), -math.inf, device=device)
        padded[: middle.numel()] = middle
        grid = padded.view(n_chunks, self.chunk)
        order = torch.sort(grid.amax(dim=1), descending=True, stable=True).indices  # best chunk first, ties: earlier
        inner = torch.sort(grid[order], dim=1, descending=True, stable=True).indices  # each chunk best token first
        tokens = (order.unsqueeze(1) * self.chunk + inner).flatten()
        tokens = tokens[tokens < middle.numel()][:room] + lo  # whole chunks, the last one cut to its best
        kept = torch.cat((torch.arange(head, device=device), tokens, torch.arange(hi, length, device=device)))
        return kept.sort().values

    def budget_split(self, budget: int) -> list[tuple[str, int]]:
        head, local = self.regions(1 << 62, budget, 0)
        what = "up to " if self.auto_budget else ""
        return [("sink and local tail, always", head + local),
                (f"{what}chunks of {self.chunk} by cosine to the activation-aware probe", budget - head - local)]
