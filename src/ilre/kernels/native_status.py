"""Which of the C kernels run in this process, and why not where one does not: for GetModelInfo (/v1/model) and
`--print-settings`."""

from __future__ import annotations

import torch

from . import layer_passes, native_attention


def kernel_status(dtype: torch.dtype) -> dict[str, str]:
    """{"chunk_attention": ..., "layer_passes": ...}: "c" where the C kernel runs for `dtype` on this CPU, else
    "pytorch" and the reason (not built and why, or PyTorch's kernel faster here)."""
    why_not = native_attention.failure()
    if native_attention.native_preferred(dtype):
        attention = "c"
    elif why_not is not None:
        attention = f"pytorch (the C kernel is not built: {why_not})"
    else:
        attention = "pytorch (faster than the C kernel on this CPU and dtype)"
    passes = "c" if layer_passes.enabled() else f"pytorch ({layer_passes.failure() or 'not built'})"
    return {"chunk_attention": attention, "layer_passes": passes}
