"""Per-model profiles: the calibrated retrieval layer l_R and what it was measured on.

A profile is `profiles/<model name>.json` (name matched case-insensitively), written by
`ilre calibrate`. Without one, l_R falls back to about a sixth of the depth, the range the paper
found for Llama and Qwen models, and the result says so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

PROFILE_DIR = Path(__file__).parent / "profiles"


@dataclass(frozen=True)
class Profile:
    """model: checkpoint name; retrieval_layer: l_R (1-based); calibrated: False for the fallback."""

    model: str
    retrieval_layer: int
    calibrated: bool = True
    details: dict = field(default_factory=dict)

    @property
    def choices(self) -> dict[str, int]:
        """Named retrieval layers a request may ask for ("fast", "default", "robust" from `ilre
        calibrate`); a profile without them offers "default" = retrieval_layer."""
        named = {str(k): int(v) for k, v in self.details.get("choices", {}).items()}
        return {**named, "default": self.retrieval_layer}

    @property
    def granularity(self) -> str:
        """What a request that names no granularity keeps: "unit" (whole sentences, lines, records) where
        the evaluation found units ahead for this model (`details.granularity`), else "token"."""
        return str(self.details.get("granularity", "token"))

    def strategy_options(self, strategy: str) -> dict:
        """The calibrated options of a strategy (e.g. the cascade's coarse_layer and candidates), which
        fill what a request leaves unset; {} when `ilre calibrate` measured none."""
        return dict(self.details.get("strategies", {}).get(strategy, {}))


EVALUATION_KEYS = ("granularity", "granularity_evidence")  # details set from the evaluation, kept by a recalibration


def profile_path(model_name: str, directory: Path = PROFILE_DIR) -> Path:
    """Where the profile of `model_name` is (or would be) stored."""
    return directory / f"{model_name.lower()}.json"


def load_profile(model_name: str, num_layers: int, global_layers: tuple[int, ...] = (),
                 directory: Path = PROFILE_DIR) -> Profile:
    """The stored profile of a model, or the uncalibrated fallback l_R = ceil(num_layers / 6) (the first of
    `global_layers` at or past it where those are named: a layer with global attention)."""
    path = profile_path(model_name, directory)
    if path.is_file():
        data = json.loads(path.read_text())
        return Profile(data["model"], int(data["retrieval_layer"]), True, data.get("details", {}))
    layer = max(1, math.ceil(num_layers / 6))
    if global_layers and layer not in global_layers:
        layer = next((l for l in global_layers if l >= layer), global_layers[-1])
    return Profile(model_name, layer, calibrated=False)


def save_profile(profile: Profile, directory: Path = PROFILE_DIR) -> Path:
    """Write a profile as JSON; returns its path."""
    path = profile_path(profile.model, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"model": profile.model, "retrieval_layer": profile.retrieval_layer, "details": profile.details}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
