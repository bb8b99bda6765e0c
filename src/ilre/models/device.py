"""Where the compressor runs: `--device auto|cpu|cuda[:N]|npu[:N]` and `--dtype auto|float32|bfloat16|float16|int8`.

`resolve_placement("auto", "auto")` picks, per device, what `make bench` measured fastest while
keeping the selections: bfloat16 on GPUs and NPUs, and on CPUs with native bfloat16 dot products
(avx512_bf16 / AMX); int8 on other x86 CPUs, where bfloat16 is emulated (~20 GFLOP/s) and int8's linear
layers run 1.6-1.7x float32's (a 32K prefill 1.56x; 95.8% of float32's kept indices, the same answers
on mixed content: docs/benchmarks.md); float32 on other CPUs, or where torch lacks oneDNN's int8 kernels.
int8 runs the linear layers in int8 through oneDNN and the rest in float32 (models/int8.py). float16 is
accepted everywhere but is ~100x slower than float32 on CPUs without float16 arithmetic.
`torch_npu` is imported only when an NPU is asked for (or `auto` finds it installed).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from .placement_names import DEVICE_HELP, DTYPE_CHOICES, DTYPE_NAMES, INT8

log = logging.getLogger(__name__)

# oneDNN (PyTorch's CPU matmuls in bfloat16) keeps a compiled kernel and its scratch memory per matrix
# shape, 1024 by default; chunk, query and candidate counts vary per request, so a long-running process
# grows with it (260 MiB over 75 mixed requests after the first 50, measured; 120 MiB with 16, at the
# same time per request). Read when the first kernel is made; the environment wins.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_NAMES}
_DEVICE = re.compile(r"^(auto|cpu|cuda|npu)(?::(\d+))?$")


class PlacementError(ValueError):
    """A device or dtype that cannot be used here; the message starts with the flag's name."""


@dataclass(frozen=True)
class Placement:
    """The device the model, key cache and scores live on, and the dtype of weights and activations;
    `int8`: the linear layers' weights and inputs in int8 (dtype is then float32, everything else's)."""

    device: torch.device
    dtype: torch.dtype
    int8: bool = False

    @property
    def dtype_name(self) -> str:
        """What `--dtype` names (int8 included): encodings and records made in another are not reused."""
        return INT8 if self.int8 else str(self.dtype).removeprefix("torch.")

    def describe(self) -> str:
        """e.g. "cpu bfloat16", "cuda:0 bfloat16"."""
        return f"{self.device} {self.dtype_name}"


def resolve_placement(device: str | None = "auto", dtype: str | None = "auto") -> Placement:
    """Parse and check `--device` / `--dtype` (None = auto); PlacementError naming the flag."""
    resolved = resolve_device(device or "auto")
    name = (dtype or "auto").strip().lower()
    if name == INT8:
        _check_int8(resolved)
        return Placement(resolved, torch.float32, int8=True)
    if name == "auto" and auto_picks_int8(resolved):
        return Placement(resolved, torch.float32, int8=True)
    return Placement(resolved, resolve_dtype(dtype or "auto", resolved))


def auto_picks_int8(device: torch.device, cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """True where `--dtype auto` runs int8: an x86 CPU without native bfloat16, with oneDNN's int8 kernels."""
    from .int8 import int8_available

    return (device.type == "cpu" and platform.machine().lower() in ("x86_64", "amd64")
            and not cpu_has_native_bfloat16(cpuinfo) and int8_available())


def _check_int8(device: torch.device) -> None:
    """PlacementError naming the flag where int8 cannot run on `device`."""
    from .int8 import int8_available

    if device.type != "cpu":
        raise PlacementError(f"dtype: int8 runs on CPUs only (got device {device}); use bfloat16 there")
    if not int8_available():
        raise PlacementError(f"dtype: int8 needs oneDNN's int8 kernels, which this torch build lacks ({torch.__version__})")


def resolve_device(name: str) -> torch.device:
    """"auto" -> cuda, else npu (when torch_npu is installed), else cpu; "cuda:1" -> checked device."""
    match = _DEVICE.match(name.strip().lower())
    if not match:
        raise PlacementError(f"device: {name!r} is not one of {DEVICE_HELP}")
    kind, index = match.group(1), match.group(2)
    if kind == "auto":
        if index is not None:
            raise PlacementError(f"device: 'auto' takes no index (got {name!r})")
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        if importlib.util.find_spec("torch_npu") is not None and _npu_count() > 0:
            return torch.device("npu", 0)
        return torch.device("cpu")
    if kind == "cpu":
        if index not in (None, "0"):
            raise PlacementError(f"device: there is one CPU device, cpu or cpu:0 (got {name!r})")
        return torch.device("cpu")
    number = int(index or 0)
    count = torch.cuda.device_count() if kind == "cuda" else _npu_count(required=True)
    if count == 0:
        why = "torch was built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
        raise PlacementError(f"device: {name!r} asked for, but {why} (torch {torch.__version__})" if kind == "cuda"
                             else f"device: {name!r} asked for, but torch_npu sees no NPU")
    if number >= count:
        raise PlacementError(f"device: {name!r} asked for, but only {count} {kind} device(s) exist (0..{count - 1})")
    return torch.device(kind, number)


def _npu_count(required: bool = False) -> int:
    """NPUs visible through torch_npu (imported here, and only here); 0 when it is absent and not required."""
    try:
        importlib.import_module("torch_npu")
    except ImportError as exc:
        if not required:
            return 0
        raise PlacementError(
            "device: npu needs the torch_npu package (Ascend's PyTorch adapter, the build matching "
            f"torch {torch.__version__}), which is not installed ({exc})"
        ) from None
    npu = getattr(torch, "npu", None)
    return int(npu.device_count()) if npu is not None and npu.is_available() else 0


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """"auto" -> the fastest tensor dtype that keeps the selections on `device` (module docstring; where
    `resolve_placement` runs int8 instead, `auto_picks_int8`, its tensors are float32, as here)."""
    key = name.strip().lower()
    if key == "auto":
        if device.type == "cpu":
            return torch.bfloat16 if cpu_has_native_bfloat16() else torch.float32
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            return torch.float16
        return torch.bfloat16
    if key == INT8:
        raise PlacementError("dtype: int8 is a placement, not a tensor dtype (resolve_placement)")
    if key not in DTYPES:
        raise PlacementError(f"dtype: {name!r} is not one of {', '.join(DTYPE_CHOICES)}")
    if key == "float16" and device.type == "cpu":
        log.warning("dtype: float16 on the CPU is emulated and ~100x slower than float32; bfloat16 is the fast one")
    return DTYPES[key]


def cpu_has_native_bfloat16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """True when the CPU multiplies bfloat16 natively (x86 avx512_bf16 / amx_bf16, Arm bf16)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return False
    flags = set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags.update(line.split(":", 1)[-1].split())
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
