"""How each global layer's keys turn with their position, found numerically, so that DCA can move them.

DCA moves keys already rotated to position p to p + s (kernels/rope.rerotate: rotate-half pairs (i, i + d/2), one
frequency per pair). A family's RoPE may turn only part of a head (partial rotary, MLA's rope part), pair dims
otherwise (interleaved), use other frequencies per layer type, or not turn a layer's keys at all (no-RoPE layers).
Each is the rotate-half form after a fixed permutation of the head's dims, with zero frequencies for the dims that do
not turn: `Rotation`. The layer hands its queries and keys permuted so (a score q.k is the same for any permutation
of both), and the moves are exact. A layer none of these forms fits leaves DCA off for the model."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.rope import rerotate

SHIFT = 1000  # positions moved in the check


@dataclass(frozen=True)
class Rotation:
    """perm: (d,) the order of a head's dims that makes its RoPE rotate-half (None: as it is); inv_freq: (d/2,)
    float32 per rotate-half pair, 0 where the dims do not turn."""

    perm: torch.Tensor | None
    inv_freq: torch.Tensor


def find_rotation(keys_at, frequencies: list[torch.Tensor], dtype: torch.dtype) -> Rotation | None:
    """The Rotation of a layer whose rotated keys (KV, T, d) at positions (T,) `keys_at(positions)` gives, among
    rotate-half or interleaved pairs over the dims that turn, with one of `frequencies` (each (n/2,)); None where
    none fits."""
    at = torch.arange(3, 7)
    near, far = keys_at(at).float(), keys_at(at + SHIFT).float()
    head_dim = near.shape[-1]
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    scale = far.abs().amax().clamp_min(1e-6)
    turning = ((far - near).abs().amax(dim=(0, 1)) > tolerance * scale).nonzero().flatten().tolist()
    if not turning:  # no RoPE here: the keys do not depend on position
        return Rotation(None, torch.zeros(head_dim // 2)) if head_dim % 2 == 0 else None
    # the whole head first (in bfloat16 a low frequency's turn over SHIFT positions hides in the rounding, so the
    # dims seen turning may not span it), then the span of the dims seen turning (partial rotary)
    for a, b in dict.fromkeys([(0, head_dim), (turning[0], turning[-1] + 1)]):
        found = _fit(near, far, a, b, frequencies, tolerance)
        if found is not None:
            return found
    return None


def _fit(near: torch.Tensor, far: torch.Tensor, a: int, b: int, frequencies: list[torch.Tensor], tolerance: float
         ) -> Rotation | None:
    """The Rotation turning dims [a, b) as rotate-half or interleaved pairs with one of `frequencies` that moves
    `near` onto `far` (the rest of the head still), or None."""
    head_dim = near.shape[-1]
    rest = [i for i in range(head_dim) if not a <= i < b]
    if (b - a) % 2 or len(rest) % 2:
        return None
    n, half = (b - a) // 2, len(rest) // 2
    layouts = (([a + i for i in range(n)], [a + n + i for i in range(n)]),  # rotate-half within [a, b)
               ([a + 2 * i for i in range(n)], [a + 2 * i + 1 for i in range(n)]))  # interleaved pairs
    for firsts, seconds in layouts:
        perm = torch.tensor(firsts + rest[:half] + seconds + rest[half:])
        for freq in frequencies:
            if freq.numel() != n:
                continue
            inv_freq = torch.cat([freq.float().cpu(), torch.zeros(half)])
            moved = rerotate(near[..., perm], inv_freq, SHIFT)
            if (moved - far[..., perm]).norm() <= tolerance * far.norm():
                identity = torch.equal(perm, torch.arange(head_dim))
                return Rotation(None if identity else perm, inv_freq)
    return None


def rotary_frequencies(base: torch.nn.Module) -> list[torch.Tensor]:
    """Every RoPE frequency table a decoder model holds (buffers named *inv_freq*: one per layer type where the
    family has several), each once."""
    found: list[torch.Tensor] = []
    for name, buffer in base.named_buffers():
        if "inv_freq" in name.rsplit(".", 1)[-1] and buffer.dim() == 1 and buffer.is_floating_point():
            if not any(f.shape == buffer.shape and torch.equal(f, buffer.float().cpu()) for f in found):
                found.append(buffer.float().cpu())
    return found
