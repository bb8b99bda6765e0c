"""What a running engine serves: the model, its layers and the limits (GetModelInfo, /v1/model)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .defaults import DEFAULT_STRATEGY


@dataclass(frozen=True)
class ModelInfo:
    """Mirrors ilre.v1.ModelInfo; `queue` and `max_message_bytes` are filled in by the front end."""

    model: str
    layer: int
    num_layers: int
    vocab_size: int
    native_context: int
    calibrated: bool
    strategies: list[str]
    default_budget: int
    max_context_tokens: int
    max_query_tokens: int
    sink: int
    window: int  # 0 = unbounded
    chunk: int
    device: str = "cpu"
    dtype: str = "float32"
    queue: str = "local"
    max_message_bytes: int = 0
    layer_choices: dict[str, int] = field(default_factory=dict)
    default_strategy: str = DEFAULT_STRATEGY
    default_strategy_options: dict[str, float] = field(default_factory=dict)
    kernels: dict[str, str] = field(default_factory=dict)  # C kernel -> "c", or "pytorch (why)"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelInfo":
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
