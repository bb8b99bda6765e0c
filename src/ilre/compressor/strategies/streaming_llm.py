"""StreamingLLM: keep the attention sink and the most recent tokens (arXiv 2309.17453)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import ScoreInputs, Strategy


@dataclass(frozen=True)
class StreamingLLM(Strategy):
    """No model pass: the score is the position, so top-k keeps the most recent tokens."""

    name = "streaming_llm"
    needs_attention = False
    needs_query = False

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        return torch.arange(inputs.length, dtype=torch.float32)
