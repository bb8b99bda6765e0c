"""The streaming prefill's settings: sink, window, chunk, DCA."""

from __future__ import annotations

from dataclasses import dataclass

from .defaults import CHUNK, SINK, WINDOW


@dataclass(frozen=True)
class PrefillConfig:
    """sink: S tokens always attended; window: W most recent tokens (None = unbounded, "FullKV");
    chunk: prefill chunk length (the first chunk is chunk + sink); dca: dual chunk attention."""

    sink: int = SINK
    window: int | None = WINDOW
    chunk: int = CHUNK
    dca: bool = False

    def __post_init__(self) -> None:
        if self.sink < 0:
            raise ValueError(f"sink: must be >= 0 (got {self.sink})")
        if self.window is not None and self.window < 1:
            raise ValueError(f"window: must be >= 1 (got {self.window})")
        if self.chunk < 1:
            raise ValueError(f"chunk: must be >= 1 (got {self.chunk})")
