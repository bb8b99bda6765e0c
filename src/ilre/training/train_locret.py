"""`ilre train-locret`: fit Locret's retaining head for one layer of a model on the CPU (section 4.2).

The backbone stays frozen; the examples (training/locret_data.py) are built once, then the head
R(x) = act(x W1) W2 is fitted with AdamW (linear warm-up and decay) on
    SmoothL1(R(x_k), S_k) + alpha * (R(x_{k+1}) - R(x_k))^2,
averaged over tokens and KV heads, one sample (a whole context, so the smoothness term sees
neighbours) per step. A tenth of the examples is held out: the validation loss and the answer
recall (the share of gold-answer tokens whose predicted score ranks in the top 10% of their
context) are printed after every epoch. Deterministic for a given seed and thread count.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..compressor.prefill_config import PrefillConfig
from ..models.device import resolve_placement
from ..models.llama import TruncatedLM
from ..models.loader import load_spec, load_tokenizer, load_truncated, resolve_checkpoint
from ..models.profiles import PROFILE_DIR, load_profile
from ..models.retaining_head import RetainingHead, head_path
from .locret_data import DataPlan, Example, build_examples

ALPHA = 2.5e-3  # the paper's weight of the smoothness term


@dataclass(frozen=True)
class TrainPlan:
    """hidden: d_R; epochs over the training examples; lr: AdamW's peak rate; warmup: its share of
    the steps; alpha: the smoothness weight; seed: initialisation and shuffling."""

    data: DataPlan = field(default_factory=DataPlan)
    hidden: int = 512
    epochs: int = 40
    lr: float = 1e-3
    warmup: float = 0.1
    alpha: float = ALPHA
    activation: str = "silu"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.hidden < 1:
            raise ValueError(f"hidden: must be >= 1 (got {self.hidden})")
        if self.epochs < 1:
            raise ValueError(f"epochs: must be >= 1 (got {self.epochs})")
        if not self.lr > 0:
            raise ValueError(f"lr: must be > 0 (got {self.lr})")
        if self.alpha < 0:
            raise ValueError(f"alpha: must be >= 0 (got {self.alpha})")


def locret_loss(predicted: torch.Tensor, labels: torch.Tensor, alpha: float) -> torch.Tensor:
    """predicted, labels: (L, KV) -> SmoothL1 mean + alpha * mean squared difference of adjacent tokens."""
    loss = F.smooth_l1_loss(predicted, labels)
    if alpha and predicted.shape[0] > 1:
        loss = loss + alpha * (predicted[1:] - predicted[:-1]).pow(2).mean()
    return loss


def answer_recall(predicted: torch.Tensor, answer: torch.Tensor, top: float = 0.1) -> float | None:
    """The share of answer positions whose max-over-heads score is in the context's top `top` share."""
    if not answer.numel():
        return None
    score = predicted.amax(dim=1)
    k = max(1, math.ceil(top * score.numel()))
    threshold = torch.topk(score, k).values[-1]
    return float((score[answer] >= threshold).float().mean())


def evaluate(head: RetainingHead, examples: list[Example], alpha: float) -> tuple[float, float | None]:
    """(mean loss, mean answer recall) of the head over examples."""
    losses, recalls = [], []
    with torch.no_grad():
        for ex in examples:
            predicted = head(ex.features.float())
            losses.append(float(locret_loss(predicted, ex.labels, alpha)))
            recall = answer_recall(predicted, ex.answer)
            if recall is not None:
                recalls.append(recall)
    return sum(losses) / len(losses), (sum(recalls) / len(recalls) if recalls else None)


def fit_head(head: RetainingHead, train: list[Example], valid: list[Example], plan: TrainPlan,
             report=None) -> list[dict]:
    """Fit `head` in place; returns the per-epoch history (train and validation loss, recall)."""
    generator = torch.Generator().manual_seed(plan.seed)
    steps = plan.epochs * len(train)
    warm = max(1, int(plan.warmup * steps))
    optimizer = torch.optim.AdamW(head.parameters(), lr=plan.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warm, max(0.0, (steps - step) / max(1, steps - warm))))
    head.train().requires_grad_(True)
    history = []
    bar = tqdm(total=steps, desc="train-locret", unit="step", file=sys.stderr, disable=None)
    for epoch in range(plan.epochs):
        total = 0.0
        for i in torch.randperm(len(train), generator=generator).tolist():
            ex = train[i]
            loss = locret_loss(head(ex.features.float()), ex.labels, plan.alpha)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            total += float(loss.detach())
            bar.update(1)
        valid_loss, recall = evaluate(head, valid, plan.alpha)
        row = {"epoch": epoch + 1, "train_loss": round(total / len(train), 5), "valid_loss": round(valid_loss, 5),
               "valid_answer_recall": None if recall is None else round(recall, 4)}
        history.append(row)
        bar.set_postfix(valid_loss=row["valid_loss"], recall=row["valid_answer_recall"])
        if report is not None:
            report(row)
    bar.close()
    head.eval().requires_grad_(False)
    return history


def split(examples: list[Example], seed: int) -> tuple[list[Example], list[Example]]:
    """A seeded tenth (at least one) held out for validation."""
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed + 1)).tolist()
    n_valid = max(1, len(examples) // 10)
    return [examples[i] for i in order[n_valid:]], [examples[i] for i in order[:n_valid]]


def load_or_build(model: TruncatedLM, tokenizer, plan: DataPlan, config: PrefillConfig, cache: Path | None,
                  key: dict) -> list[Example]:
    """The examples of `plan`: read from `cache` when it holds the same plan and model, else built
    (with a progress bar) and written there."""
    if cache is not None and cache.is_file():
        saved = torch.load(cache, weights_only=False)
        if saved.get("key") == key:
            return saved["examples"]
        print(f"train-locret: {cache} holds other examples: building them again", file=sys.stderr)
    with tqdm(total=plan.samples, desc="examples", unit="sample", file=sys.stderr, disable=None) as bar:
        examples = build_examples(model, tokenizer, plan, config, bar.update)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"key": key, "examples": examples}, cache)
    return examples


def train_locret(model_ref: str | None, layer: int | None, plan: TrainPlan, output_dir: Path = PROFILE_DIR,
                 device: str = "auto", dtype: str = "auto", command: str = "", report=None,
                 cache: Path | None = None) -> Path:
    """Build the examples (or read them from `cache`), fit the head, write it next to the model's
    profile; returns its path."""
    started = time.perf_counter()
    placement = resolve_placement(device, dtype)
    checkpoint = resolve_checkpoint(model_ref)
    spec = load_spec(checkpoint.path)
    layer = layer or load_profile(checkpoint.name, spec.num_layers).retrieval_layer
    if not 1 <= layer <= spec.num_layers:
        raise ValueError(f"layer: must be in 1..{spec.num_layers} (got {layer})")
    torch.manual_seed(plan.seed)
    model = load_truncated(checkpoint.path, layer, placement.dtype, placement.device)
    tokenizer = load_tokenizer(checkpoint.path)
    config = PrefillConfig()
    key = {"model": checkpoint.name, "layer": layer, "data": asdict(plan.data), "prefill": asdict(config),
           "placement": placement.describe()}
    examples = load_or_build(model, tokenizer, plan.data, config, cache, key)
    built = time.perf_counter() - started
    train, valid = split(examples, plan.seed)
    head = RetainingHead.for_spec(spec, plan.hidden, plan.activation, plan.seed)
    before = evaluate(head, valid, plan.alpha)
    history = fit_head(head, train, valid, plan, report)
    head.meta = {
        "model": checkpoint.name, "layer": layer, "hidden": plan.hidden, "command": command,
        "plan": asdict(plan), "prefill": asdict(config), "placement": placement.describe(),
        "examples": {"train": len(train), "valid": len(valid), "tokens": sum(e.labels.shape[0] for e in examples)},
        "untrained_valid_loss": round(before[0], 5), "history": history,
        "seconds": {"examples": round(built, 1), "total": round(time.perf_counter() - started, 1)},
    }
    path = head.save(head_path(checkpoint.name, layer, output_dir))
    print(json.dumps({"head": str(path), "layer": layer, **history[-1], "seconds": head.meta["seconds"]}),
          file=sys.stderr)
    return path
