"""`ilre calibrate`: the appendix A.1 retrieval task over every layer, the profile, Figure-2 heatmaps.

For each context length x key length x depth, one streaming pass yields every layer's keys and
queries; each layer is scored with one kernel (SnapKV-like) and with the multi-kernel allocation.
Two grids: the paper's (within the native window) and a long one (beyond it, DCA on, distractor
passkeys). l_R = among the layers with the best multi-kernel recall on the paper's grid, the best on
the long one (then the smallest); the profile also names `fast` (the paper's rule: the smallest
best layer) and `robust` (the best long-context recall), which a request may ask for by name.
"""

from __future__ import annotations

import datetime
import itertools
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from ..compressor.calibration import (CANDIDATE_FACTORS, COST_CAP, candidate_hits, cascade_cost, pick_candidate_factor,
                                      pick_layer, pick_layers, recall_by_layer)
from ..compressor.defaults import COARSE_BELOW, DEEPEN_BELOW
from ..compressor.prefill import streaming_prefill
from ..compressor.prefill_config import PrefillConfig
from ..compressor.strategies import make_strategy
from ..evaluation.tasks.passkey import make_passkey_sample
from .calibration_samples import SampleLog
from ..models.device import Placement
from ..models.loader import load_spec, resolve_checkpoint
from ..models.profiles import EVALUATION_KEYS, PROFILE_DIR, Profile, load_profile, save_profile


@dataclass(frozen=True)
class CalibrationPlan:
    """lengths: context tokens (within the native window); digits: passkey lengths; depths: how
    many equal segments the needle visits; budget: tokens kept, as in the paper (1024).
    The long grid, for how the product is used: long_lengths (beyond the native window, DCA on),
    long_digits, long_depths, and `distractors` other passkey phrases in each of its contexts
    (multikey-style); empty long_lengths = the paper's rule alone."""

    lengths: tuple[int, ...] = (2048, 6144)
    digits: tuple[int, ...] = (8, 32)
    depths: int = 20
    budget: int = 1024
    seed: int = 0
    long_lengths: tuple[int, ...] = (16384, 32768)
    long_digits: tuple[int, ...] = (8, 32)
    long_depths: int = 5
    distractors: int = 100  # 3 tie every good layer at 1.0 (docs/calibration); multikey_3 hides its needle among hundreds

    def long_grid(self) -> "CalibrationPlan":
        """The long grid as a plan of its own (for the shared sampling and plotting code)."""
        return replace(self, lengths=self.long_lengths, digits=self.long_digits, depths=self.long_depths)


QUICK_PLAN = CalibrationPlan(lengths=(2048,), digits=(8, 32), depths=4, long_lengths=(), long_depths=2)


def grid_hits(truncated, tokenizer, plan: CalibrationPlan, config: PrefillConfig, strategies: dict, layers: tuple[int, ...],
              distractors: int, label: str, coarse: int | None = None, log: SampleLog | None = None
              ) -> dict[str, torch.Tensor]:
    """Whole-needle hits (lengths, digits, depths, layers) per strategy over the plan's passkey grid,
    one streaming pass per sample serving every layer; with a `coarse` layer also "candidates":
    (lengths, digits, depths, CANDIDATE_FACTORS), the needle among the cascade's candidates. `log`: where each
    sample's hits are kept as measured and found again on a rerun (calibration_samples.py)."""
    grid = list(itertools.product(plan.lengths, plan.digits, range(plan.depths)))
    hits = {name: torch.zeros(len(plan.lengths), len(plan.digits), plan.depths, len(layers)) for name in strategies}
    if coarse is not None:
        hits["candidates"] = torch.zeros(len(plan.lengths), len(plan.digits), plan.depths, len(CANDIDATE_FACTORS))
    for length, digits, depth in tqdm(grid, desc=label, unit="sample", file=sys.stderr):
        key = (label, length, digits, depth)
        found = log.get(key) if log is not None else None
        if found is None:
            found = _sample_hits(truncated, tokenizer, plan, config, strategies, layers, distractors, coarse,
                                 (length, digits, depth))
            if log is not None:
                log.add(key, found)
        at = (plan.lengths.index(length), plan.digits.index(digits), depth)
        for name, row in found.items():
            hits[name][at] = torch.tensor(row)
    return hits


def _sample_hits(truncated, tokenizer, plan: CalibrationPlan, config: PrefillConfig, strategies: dict,
                 layers: tuple[int, ...], distractors: int, coarse: int | None, where: tuple[int, int, int]
                 ) -> dict[str, list[float]]:
    """One sample's hits: per strategy, 0/1 per layer; with a `coarse` layer, "candidates": 0/1 per factor."""
    length, digits, depth = where
    sample = make_passkey_sample(tokenizer, length, depth / plan.depths, digits, seed=plan.seed, distractors=distractors)
    with torch.inference_mode():
        state = streaming_prefill(truncated, torch.tensor(sample.context_ids), torch.tensor(sample.query_ids),
                                  config, layers)
        recalls = recall_by_layer(state, sample.needle, plan.budget, config.sink, strategies)
        out = {name: [float(per_layer[l]) for l in layers] for name, per_layer in recalls.items()}
        if coarse is not None:
            found = candidate_hits(state, sample.needle, plan.budget, config, coarse, CANDIDATE_FACTORS,
                                   strategies["multi"].allocator)
            out["candidates"] = [float(found[f]) for f in CANDIDATE_FACTORS]
    return out




def cascade_details(coarse: int, l_r: int, plan: CalibrationPlan, candidates: torch.Tensor,
                    kept_at_l_r: torch.Tensor) -> dict:
    """The cascade's calibrated options and what chose them. candidates: (..., factors) needle among the
    candidates per long sample; kept_at_l_r: (...) the needle kept by plain ILRe at l_R per long sample.
    The candidate factor is the largest whose cost at the longest long length stays within COST_CAP
    of plain ILRe at the coarse layer; the recall columns show what each factor would lose."""
    longest = max(plan.long_lengths)
    costs = {f: round(cascade_cost(coarse, l_r, f, plan.budget, longest), 3) for f in CANDIDATE_FACTORS}
    factor = pick_candidate_factor(costs)
    held = candidates[kept_at_l_r.bool()]  # (samples l_R keeps, factors)
    return {
        "strategies": {"cascade": {"coarse_layer": coarse, "candidates": factor, "coarse_weight": 0.5,
                                   "coarse_below": COARSE_BELOW, "deepen_below": DEEPEN_BELOW}},
        "cascade": {
            "method": f"coarse layer = fast; candidates = the largest factor (of {list(CANDIDATE_FACTORS)}) whose prefill "
                      f"at {longest} tokens costs at most {COST_CAP}x plain ILRe at the coarse layer (layer-tokens); "
                      f"coarse_weight 0.5 (stage 18 of the evaluation); coarse_below {COARSE_BELOW} and deepen_below "
                      f"{DEEPEN_BELOW} (bench/mixed_bench.py: depth paid once, decided before the candidate pass)",
            "costs": {str(f): c for f, c in costs.items()},
            "candidate_recall_long": {str(f): round(float(v), 4) for f, v in zip(CANDIDATE_FACTORS, candidates.mean(
                dim=tuple(range(candidates.dim() - 1))))},
            "kept_by_l_r_among_candidates": {str(f): round(float(v), 4) for f, v in zip(
                CANDIDATE_FACTORS, held.mean(dim=0) if len(held) else torch.zeros(len(CANDIDATE_FACTORS)))},
        },
    }


def run_calibration(model: str | None, plan: CalibrationPlan, profile_dir: Path = PROFILE_DIR,
                    plot_dir: Path | None = None, prefill: PrefillConfig | None = None,
                    placement: Placement | None = None) -> Profile:
    """Measure recall per layer on both grids, save the profile (and heatmaps), return the profile.
    placement: device and dtype of the pass (default: float32 on the CPU, as the profiles were made)."""
    from ..engine.engine import Engine, EngineConfig

    checkpoint = resolve_checkpoint(model)
    spec = load_spec(checkpoint.path)
    too_long = [n for n in plan.lengths if n + 64 > spec.native_context]
    if too_long:
        raise ValueError(f"lengths: {too_long} exceed the model's native window of {spec.native_context} tokens")
    if min(plan.lengths + plan.long_lengths) <= plan.budget:
        raise ValueError(f"lengths: every context must be longer than the budget of {plan.budget} tokens")
    placement = placement or Placement(torch.device("cpu"), torch.float32)
    # the engine's model, tokenizer and prefill settings: what is measured is what a request runs
    engine = Engine(EngineConfig(model=model, device=str(placement.device), dtype=placement.dtype_name,
                                 prefill=prefill or PrefillConfig(), layer=spec.global_layers[0], doc_cache_mb=0))
    tokenizer, config = engine.tokenizer, engine.config.prefill
    truncated = engine.model_at(spec.num_layers)
    strategies = {"single": make_strategy("snapkv"), "multi": make_strategy("ilre")}
    layers = spec.global_layers  # l_R and the coarse layer see the whole context (not a sliding or linear layer)
    log = SampleLog({"model": checkpoint.name, "placement": placement.describe(), "plan": asdict(plan),
                     "prefill": asdict(config), "layers": list(layers)})
    print(f"samples kept in {log.path} ({len(log.done)} measured already)", file=sys.stderr)
    hits = grid_hits(truncated, tokenizer, plan, config, strategies, layers, 0, f"calibrate {checkpoint.name}", log=log)
    recall = {name: h.mean(dim=(0, 1, 2)) for name, h in hits.items()}  # (layers,)
    per_layer = lambda r: {l: round(float(r[k]), 4) for k, l in enumerate(layers)}  # noqa: E731
    long_hits, long_recall = {}, {}
    coarse = pick_layer(per_layer(recall["multi"]))  # `fast`: the cascade's coarse layer
    if plan.long_lengths:
        long_hits = grid_hits(truncated, tokenizer, plan.long_grid(), replace(config, dca=True), strategies, layers,
                              plan.distractors, f"calibrate {checkpoint.name} (long, DCA)", coarse, log=log)
        candidates = long_hits.pop("candidates")
        long_recall = {name: h.mean(dim=(0, 1, 2)) for name, h in long_hits.items()}
    choices = pick_layers(per_layer(recall["multi"]), per_layer(long_recall["multi"]) if long_recall else None)
    layer = choices["default"]
    details = {
        "method": "appendix A.1 passkey retrieval, whole-phrase recall, the best multi-kernel recall within the native "
                  "window; ties broken by the recall beyond it (DCA on, distractor passkeys)",
        "date": datetime.date.today().isoformat(),
        "plan": {**asdict(plan), "placement": placement.describe(), "sink": config.sink, "window": config.window,
                 "chunk": config.chunk},
        "samples": len(plan.lengths) * len(plan.digits) * plan.depths
                   + len(plan.long_lengths) * len(plan.long_digits) * plan.long_depths,
        "choices": choices,
        # relative prefill time of a choice: the layers a context runs through (l_R is q/k only)
        "cost": {name: round(l / choices["fast"], 2) for name, l in choices.items()},
        "recall_multi": per_layer(recall["multi"]),
        "recall_single": per_layer(recall["single"]),
    }
    if long_recall:
        details["recall_long_multi"] = per_layer(long_recall["multi"])
        details["recall_long_single"] = per_layer(long_recall["single"])
        if coarse < layer:
            details.update(cascade_details(coarse, layer, plan, candidates, long_hits["multi"][..., layers.index(layer)]))
            details["cost"]["cascade"] = details["cascade"]["costs"][str(details["strategies"]["cascade"]["candidates"])]
        else:  # no layer below l_R ranks as well: the default is plain ILRe at l_R
            details["cascade"] = {"method": f"none: the coarse layer's pick (fast, the best multi-kernel recall) is l_R = "
                                            f"{layer} itself, so the default runs plain ILRe at l_R, no candidate pass"}
    kept = load_profile(checkpoint.name, spec.num_layers, directory=profile_dir).details  # what the evaluation chose stays
    details.update({k: kept[k] for k in EVALUATION_KEYS if k in kept})
    profile = Profile(checkpoint.name, layer, True, details)
    path = save_profile(profile, profile_dir)
    at = layers.index(layer)
    print(f"l_R = {layer} (choices {choices}; multi-kernel recall {float(recall['multi'][at]):.3f}"
          + (f", long {float(long_recall['multi'][at]):.3f}" if long_recall else "") + f"); profile -> {path}",
          file=sys.stderr)
    if plot_dir is not None:
        from .heatmaps import calibration_heatmaps

        written = calibration_heatmaps(checkpoint.name, hits, plan, layers, plot_dir)
        if long_hits:
            written += calibration_heatmaps(checkpoint.name, long_hits, plan.long_grid(), layers, plot_dir, suffix="-long")
        for out in written:
            print(f"heatmap -> {out}", file=sys.stderr)
    return profile
