"""`ilre calibrate`: the appendix A.1 retrieval task over every layer, the profile, Figure-2 heatmaps.

For each context length x key length x depth, one streaming pass yields every layer's keys and
queries; each layer is scored with one kernel (SnapKV-like) and with the multi-kernel allocation.
l_R = the smallest layer with the highest multi-kernel recall.
"""

from __future__ import annotations

import datetime
import itertools
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ..compressor.calibration import pick_layer, recall_by_layer
from ..compressor.prefill import PrefillConfig, streaming_prefill
from ..compressor.strategies import make_strategy
from ..models.device import Placement
from ..models.loader import load_spec, load_tokenizer, load_truncated, resolve_checkpoint
from ..models.profiles import PROFILE_DIR, Profile, save_profile
from .passkey import make_passkey_sample


@dataclass(frozen=True)
class CalibrationPlan:
    """lengths: context tokens (within the native window); digits: passkey lengths; depths: how
    many equal segments the needle visits; budget: tokens kept, as in the paper (1024)."""

    lengths: tuple[int, ...] = (2048, 6144)
    digits: tuple[int, ...] = (8, 32)
    depths: int = 20
    budget: int = 1024
    seed: int = 0


QUICK_PLAN = CalibrationPlan(lengths=(2048,), digits=(8, 32), depths=4)


def run_calibration(model: str | None, plan: CalibrationPlan, profile_dir: Path = PROFILE_DIR,
                    plot_dir: Path | None = None, prefill: PrefillConfig | None = None,
                    placement: Placement | None = None) -> Profile:
    """Measure recall per layer, save the profile (and heatmaps), return the profile.
    placement: device and dtype of the pass (default: float32 on the CPU, as the profiles were made)."""
    checkpoint = resolve_checkpoint(model)
    spec = load_spec(checkpoint.path)
    too_long = [n for n in plan.lengths if n + 64 > spec.native_context]
    if too_long:
        raise ValueError(f"lengths: {too_long} exceed the model's native window of {spec.native_context} tokens")
    if min(plan.lengths) <= plan.budget:
        raise ValueError(f"lengths: every context must be longer than the budget of {plan.budget} tokens")
    tokenizer = load_tokenizer(checkpoint.path)
    placement = placement or Placement(torch.device("cpu"), torch.float32)
    truncated = load_truncated(checkpoint.path, spec.num_layers, placement.dtype, placement.device)
    config = prefill or PrefillConfig()
    strategies = {"single": make_strategy("snapkv"), "multi": make_strategy("ilre")}
    layers = tuple(range(1, spec.num_layers + 1))
    grid = list(itertools.product(plan.lengths, plan.digits, range(plan.depths)))
    hits = {name: torch.zeros(len(plan.lengths), len(plan.digits), plan.depths, len(layers)) for name in strategies}
    for length, digits, depth in tqdm(grid, desc=f"calibrate {checkpoint.name}", unit="sample", file=sys.stderr):
        sample = make_passkey_sample(tokenizer, length, depth / plan.depths, digits, seed=plan.seed)
        with torch.inference_mode():
            state = streaming_prefill(truncated, torch.tensor(sample.context_ids), torch.tensor(sample.query_ids),
                                      config, layers)
            recalls = recall_by_layer(state, sample.needle, plan.budget, config.sink, strategies)
        at = (plan.lengths.index(length), plan.digits.index(digits), depth)
        for name, per_layer in recalls.items():
            hits[name][at] = torch.tensor([float(per_layer[l]) for l in layers])
    recall = {name: h.mean(dim=(0, 1, 2)) for name, h in hits.items()}  # (layers,)
    layer = pick_layer({l: round(float(recall["multi"][l - 1]), 6) for l in layers})
    details = {
        "method": "appendix A.1 passkey retrieval, whole-phrase recall, smallest layer with the highest multi-kernel recall",
        "date": datetime.date.today().isoformat(),
        "plan": {"lengths": plan.lengths, "digits": plan.digits, "depths": plan.depths, "budget": plan.budget,
                 "seed": plan.seed, "placement": placement.describe(), "sink": config.sink, "window": config.window, "chunk": config.chunk},
        "samples": len(grid),
        "recall_multi": {l: round(float(recall["multi"][l - 1]), 4) for l in layers},
        "recall_single": {l: round(float(recall["single"][l - 1]), 4) for l in layers},
    }
    profile = Profile(checkpoint.name, layer, True, details)
    path = save_profile(profile, profile_dir)
    print(f"l_R = {layer} (multi-kernel recall {float(recall['multi'][layer - 1]):.3f}); profile -> {path}", file=sys.stderr)
    if plot_dir is not None:
        from .plots import calibration_heatmaps

        for out in calibration_heatmaps(checkpoint.name, hits, plan, layers, plot_dir):
            print(f"heatmap -> {out}", file=sys.stderr)
    return profile
