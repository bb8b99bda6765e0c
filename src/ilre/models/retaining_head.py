"""Locret's retaining head (section 4.2 of its paper): a small MLP on a token's own q/k/v.

R([q, k, v]) = act([q, k, v] W1) W2 predicts, per KV head, the token's causal importance: the
largest pre-softmax attention logit any answer token gives it. Inputs are the retrieval layer's
projections before RoPE (after q/k norms, as `Attention.parts` gives raw_queries / raw_keys), all
heads side by side, so the prediction depends on the token alone and never on its position.

A head is stored as safetensors (`W1`, `W2`) with metadata naming the model, the layer, the
activation and how it was trained. The one shipped for the embedded model lives beside its
profile (`models/profiles/`); `ilre train-locret` writes others there or where told.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .llama import TruncatedLM
from .profiles import PROFILE_DIR
from .spec import ModelSpec

ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}


class RetainingHead(nn.Module):
    """W1: (H*d + 2*KV*d, hidden), W2: (hidden, KV); no biases (the paper's head)."""

    def __init__(self, in_features: int, hidden: int, kv_heads: int, activation: str = "silu",
                 meta: dict | None = None):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation: one of {', '.join(ACTIVATIONS)} (got {activation!r})")
        self.w1 = nn.Parameter(torch.empty(in_features, hidden))
        self.w2 = nn.Parameter(torch.empty(hidden, kv_heads))
        self.activation = activation
        self.meta = dict(meta or {})

    @classmethod
    def for_spec(cls, spec: ModelSpec, hidden: int, activation: str = "silu", seed: int = 0,
                 meta: dict | None = None) -> "RetainingHead":
        """A freshly initialised head for a model (Kaiming-uniform W1, small W2), deterministic per seed."""
        in_features = (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim
        head = cls(in_features, hidden, spec.num_kv_heads, activation, meta)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            head.w1.uniform_(-1.0, 1.0, generator=generator).mul_(in_features ** -0.5)
            head.w2.uniform_(-1.0, 1.0, generator=generator).mul_(hidden ** -0.5)
        return head

    @property
    def hidden(self) -> int:
        return self.w1.shape[1]

    @staticmethod
    def features(raw_q: torch.Tensor, raw_k: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """raw_q: (H, T, d), raw_k / values: (KV, T, d) -> (T, H*d + 2*KV*d): each token's heads side by side."""
        return torch.cat([t.transpose(0, 1).reshape(t.shape[1], -1) for t in (raw_q, raw_k, values)], dim=-1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features: (..., T, in_features) -> (..., T, KV) predicted importance, in the weights' dtype."""
        hidden = ACTIVATIONS[self.activation](features.to(self.w1.dtype) @ self.w1)
        return hidden @ self.w2

    def score(self, raw_q: torch.Tensor, raw_k: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """The prefill's hook: (H, T, d), (KV, T, d), (KV, T, d) -> (KV, T, 1) float32 predictions."""
        return self(self.features(raw_q, raw_k, values)).float().transpose(0, 1).unsqueeze(-1)

    def save(self, path: Path) -> Path:
        """Write W1, W2 (float32) and the metadata; returns the path."""
        from safetensors.torch import save_file

        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"activation": self.activation, **{k: json.dumps(v) for k, v in self.meta.items()}}
        save_file({"W1": self.w1.detach().float().contiguous(), "W2": self.w2.detach().float().contiguous()},
                  str(path), metadata=meta)
        path.chmod(0o644)  # a head is shared like a profile (the writer's default is owner-only)
        return path

    @classmethod
    def load(cls, path: Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> "RetainingHead":
        """Read a head written by `save`, in `dtype` on `device`, frozen."""
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            raw_meta = f.metadata() or {}
            w1, w2 = f.get_tensor("W1"), f.get_tensor("W2")
        activation = raw_meta.pop("activation", "silu")
        meta = {k: json.loads(v) for k, v in raw_meta.items()}
        head = cls(w1.shape[0], w1.shape[1], w2.shape[1], activation, meta)
        head.load_state_dict({"w1": w1, "w2": w2})
        return head.to(device=device, dtype=dtype).eval().requires_grad_(False)


def head_path(model_name: str, layer: int, directory: Path = PROFILE_DIR) -> Path:
    """Where the retaining head of `model_name` at `layer` is (or would be) stored."""
    return directory / f"{model_name.lower()}.locret-layer{layer}.safetensors"


def find_head(model_name: str, layer: int, spec: ModelSpec, directories: tuple[Path, ...] = (PROFILE_DIR,),
              dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> RetainingHead | None:
    """The first stored head for the model and layer that fits its shapes, or None."""
    for directory in directories:
        path = head_path(model_name, layer, directory)
        if path.is_file():
            head = RetainingHead.load(path, dtype, device)
            expected = (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim
            if head.w1.shape[0] != expected or head.w2.shape[1] != spec.num_kv_heads:
                raise ValueError(f"locret: {path} has shapes {tuple(head.w1.shape)} / {tuple(head.w2.shape)}, "
                                 f"not those of {model_name}; train it again with `ilre train-locret`")
            return head
    return None


def head_directories() -> tuple[Path, ...]:
    """Where heads are looked for: $ILRE_LOCRET_DIR (if set), then the profiles shipped with ilre."""
    extra = os.environ.get("ILRE_LOCRET_DIR")
    return ((Path(extra),) if extra else ()) + (PROFILE_DIR,)


def attach_head(model: TruncatedLM, model_name: str) -> TruncatedLM:
    """Give `model` the stored retaining head for its last layer (l_R), if there is one, in its dtype."""
    model.retaining_head = find_head(model_name, model.n_layers, model.spec, head_directories(), model.dtype, model.device)
    return model
