"""What one candidate pass leaves for the next over the same context: each candidate's K/V above the coarse layer.

A cascade's questions about one document pick overlapping candidates (two thirds or more of them in common at
32K, even for unrelated questions: the coarse layer's peaks are partly the document's own). A document that keeps
its stream (engine/encodings.py, while it waits for deepening) also keeps the rows of its latest candidate pass
(`RowMemo`): per candidate, its keys and values at layers l_c..l_R-1 and its key at l_R. The next pass from the
stream (compressor/candidate_prefill.py) runs only its candidates that are not held; a held candidate's K/V are
read as the earlier pass computed them, where it attended to that pass's candidates, not this one's. That is an
approximation (measured: bench/stream_agreement.py); where the earlier candidates were this pass's own up to the
held row (same stream, same candidates before it) it is exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CandidateRows:
    """The candidates of one pass: `positions` (R,) int64 ascending context indices; `first`: the first layer held
    (the coarse layer l_c); `l_r`: the pass's l_R; `keys`, `values`: (l_R - first, kv_heads, R, d), each row's K and
    V at layers first..l_R-1 as that pass computed them (RoPE at the row's own position, before any DCA move);
    `top`: (kv_heads, R, d) its keys at l_R (before DCA's moves)."""

    positions: torch.Tensor
    first: int
    l_r: int
    keys: torch.Tensor
    values: torch.Tensor
    top: torch.Tensor

    @property
    def nbytes(self) -> int:
        """Memory held: (R x ((l_R - first) x 2 + 1) x kv_heads x d) values and the positions."""
        return sum(t.numel() * t.element_size() for t in (self.positions, self.keys, self.values, self.top))

    def find(self, candidates: torch.Tensor) -> torch.Tensor:
        """candidates: (C,) int64 ascending -> (C,) int64, each one's row here, -1 where not held."""
        if self.positions.numel() == 0:
            return torch.full_like(candidates, -1)
        at = torch.searchsorted(self.positions, candidates).clamp(max=self.positions.numel() - 1)
        return torch.where(self.positions[at] == candidates, at, torch.full_like(at, -1))


class RowMemo:
    """Where a context's candidate passes leave their rows (ContextState.rows): `rows` is the latest pass's (None
    before any), replaced by each pass, so it holds one pass's candidates at most; `layer`: the first layer kept
    (the encoding's top, the coarse layer); `reused`: how many candidates the latest pass read from the rows."""

    def __init__(self, layer: int, rows: CandidateRows | None = None):
        self.layer, self.rows, self.reused = layer, rows, 0

    @property
    def nbytes(self) -> int:
        return 0 if self.rows is None else self.rows.nbytes

    def usable(self, first: int, l_r: int) -> CandidateRows | None:
        """The rows, where a pass that starts at layer `first` and ranks at `l_r` can read them (None: it cannot)."""
        rows = self.rows
        return rows if rows is not None and rows.first <= first and rows.l_r == l_r else None

    def carried(self) -> "RowMemo":
        """A memo for a longer context that takes this one's encoding on (the same rows: their positions stand)."""
        return RowMemo(self.layer, self.rows)
