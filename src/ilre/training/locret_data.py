"""Training data for Locret's retaining head (`ilre train-locret`), built on the CPU from the truncated model.

One example per synthetic sample (RULER tasks and passkeys, from a seed of their own, so the
evaluation's samples are never trained on):
- features: every context token's raw q, k and v at the chosen layer, from the same streaming
  prefill that compression runs (`encode_context`), so training sees what inference will;
- labels (the causal importance score, section 4.2): for KV head j and context token k, the largest
  pre-softmax logit q_p . k_k / sqrt(d) over the answer positions p and the query heads of group j,
  with FULL causal attention over context + question + gold answer in the layers below.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..compressor.context_state import HEAD_INPUTS
from ..compressor.prefill import encode_context
from ..compressor.prefill_config import PrefillConfig
from ..evaluation.tasks.passkey import make_passkey_sample
from ..evaluation.tasks.ruler import TASKS, generate_sample
from ..models.llama import TruncatedLM
from ..models.retaining_head import RetainingHead

RULER_TASKS = ("cwe", "fwe", "niah_multikey_1", "niah_multikey_2", "niah_multikey_3", "niah_multiquery",
               "niah_multivalue", "niah_single_1", "niah_single_2", "niah_single_3", "vt")  # what the shipped head saw


@dataclass
class Example:
    """features: (L, H*d + 2*KV*d) in the model's dtype; labels: (L, KV) float32; answer: the
    context positions that hold a gold answer (for the validation's recall)."""

    features: torch.Tensor
    labels: torch.Tensor
    answer: torch.Tensor
    source: str


@dataclass(frozen=True)
class DataPlan:
    """samples: how many examples; lengths: context sizes drawn from; passkey_share: the fraction
    that are passkeys (the rest cycles through `tasks`, in sorted order); seed: the generators' seed."""

    samples: int = 320
    tasks: tuple[str, ...] = RULER_TASKS
    lengths: tuple[int, ...] = (1024, 2048, 3072)
    passkey_share: float = 0.25
    seed: int = 1234

    def __post_init__(self) -> None:
        if self.samples < 2:
            raise ValueError(f"samples: must be >= 2 (got {self.samples})")
        if not self.lengths or min(self.lengths) < 128:
            raise ValueError(f"lengths: must be >= 128 tokens each (got {self.lengths})")
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown or not self.tasks:
            raise ValueError(f"tasks: unknown or none {unknown} (known: {', '.join(TASKS)})")
        if not 0.0 <= self.passkey_share <= 1.0:
            raise ValueError(f"passkey_share: must be within [0, 1] (got {self.passkey_share})")


def dense_answer_logits(model: TruncatedLM, ids: torch.Tensor, n_context: int, answer: slice) -> torch.Tensor:
    """ids: (T,) = context + question + answer -> (KV, n_context) float32 labels: per KV head, the max
    over its group's query heads and the `answer` positions of q . k / sqrt(d) at the last layer,
    with full causal attention (no window, no sink) in the layers below."""
    spec, top = model.spec, model.n_layers
    cos, sin = model.rope(torch.arange(ids.numel(), device=model.device))
    h = model.embed(ids.to(model.device))
    for l in range(1, top):
        layer = model.layer(l)
        q, k, v = layer.qkv(h, cos, sin)
        out = F.scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), is_causal=True,
                                             enable_gqa=True).squeeze(0)
        h = layer.finish(h, out)
    got = model.layer(top).parts(h, cos, sin, ("queries", "keys"))
    q = got["queries"][:, answer].float().reshape(spec.num_kv_heads, -1, spec.head_dim)  # (KV, group*A, d)
    k = got["keys"][:, :n_context].float()
    return (q @ k.transpose(1, 2) / math.sqrt(spec.head_dim)).amax(dim=1)


def _answer_positions(context_ids: list[int], answers_ids: list[list[int]]) -> torch.Tensor:
    """Context positions covered by any occurrence of an answer's token ids."""
    hit = torch.zeros(len(context_ids), dtype=torch.bool)
    ctx = torch.tensor(context_ids)
    for ans in answers_ids:
        n = len(ans)
        if not n or n > len(context_ids):
            continue
        windows = ctx.unfold(0, n, 1)
        for start in torch.nonzero((windows == torch.tensor(ans)).all(dim=1)).flatten().tolist():
            hit[start: start + n] = True
    return torch.nonzero(hit).flatten()


def build_example(model: TruncatedLM, tokenizer, context_ids: list[int], query_ids: list[int], answers: list[str],
                  config: PrefillConfig, source: str) -> Example:
    """One training example: streaming-prefill features and full-attention labels of a sample."""
    answer_ids = tokenizer(" " + ", ".join(answers), add_special_tokens=False).input_ids
    ids = torch.tensor(context_ids + query_ids + answer_ids, dtype=torch.int64)
    n = len(context_ids)
    with torch.inference_mode():
        state = encode_context(model, torch.tensor(context_ids, dtype=torch.int64), config, parts=HEAD_INPUTS)
        features = RetainingHead.features(*(state.parts[p] for p in HEAD_INPUTS))
        labels = dense_answer_logits(model, ids, n, slice(n + len(query_ids), ids.numel())).transpose(0, 1)
    in_context = [tokenizer(" " + a, add_special_tokens=False).input_ids for a in answers]
    in_context += [tokenizer(a, add_special_tokens=False).input_ids for a in answers]
    # cloned outside inference mode: training reads them under autograd, and .cpu() copies nothing on a CPU
    return Example(features.cpu().clone(), labels.cpu().clone(), _answer_positions(context_ids, in_context), source)


def build_examples(model: TruncatedLM, tokenizer, plan: DataPlan, config: PrefillConfig, progress=None) -> list[Example]:
    """plan.samples examples: passkeys at random depths and the RULER tasks in turn, lengths in turn."""
    rng = random.Random(plan.seed)
    tasks = sorted(plan.tasks)
    out = []
    for i in range(plan.samples):
        length = plan.lengths[i % len(plan.lengths)]
        if rng.random() < plan.passkey_share:
            sample = make_passkey_sample(tokenizer, length, rng.random(), seed=plan.seed + i)
            context, query, answers, source = sample.context_ids, sample.query_ids, [sample.passkey], "passkey"
        else:
            task = tasks[i % len(tasks)]
            sample = generate_sample(tokenizer, task, length, plan.seed, i)
            context, query, answers, source = sample.context_ids, sample.query_ids, sample.answers, task
        out.append(build_example(model, tokenizer, context, query, answers, config, source))
        if progress is not None:
            progress(1)
    return out
