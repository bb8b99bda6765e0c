"""bfloat16 linear layers whose weights oneDNN packs once, at load, instead of at every product.

oneDNN's bfloat16 matmul (what `F.linear` runs on a CPU with native bfloat16: avx512_bf16, AMX) copies a plain
(N, K) weight into its blocked, pair-interleaved layout on every call. For a 1024-token chunk that copy is a few
percent of the product; for a query's few dozen rows, where the product itself is short, an eighth to a sixth
(bench/packed_weights_bench.py). Packed once, the layer's products skip it: the same oneDNN kernels on the same
operands, each product within one bfloat16 rounding of F.linear's (at least 99% of elements equal where measured)
and the same tokens kept on the evaluation's tasks (tests/models/test_packed_linear.py). The plain weight is
dropped, so the model holds each matrix once.

The packing goes through PyTorch's private oneDNN ops (`torch.ops.mkldnn._reorder_linear_weight`,
`_linear_pointwise`); where a PyTorch build lacks them, or their product is not F.linear's on a probe (checked once
per process), the weights stay plain.
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import nn

log = logging.getLogger(__name__)

BATCH_HINT = 1024  # the rows oneDNN picks the packed layout for: a prefill chunk
PACKED = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")  # a fused layer's matrices (models/llama.py)


class PackedLinear(nn.Module):
    """y = x W^T (+ b) with W (N, K) bfloat16 held in oneDNN's packed layout. `weight` gives the plain (N, K)
    matrix back (a copy, for readers such as references; the products never need it)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.out_features, self.in_features = linear.weight.shape
        self.bias = None if linear.bias is None else linear.bias.detach()
        self._packed = {(0, self.out_features): _pack(linear.weight.detach())}

    @property
    def weight(self) -> torch.Tensor:
        """The plain (N, K) weight, unpacked (exactly the loaded one)."""
        return self._packed[0, self.out_features].to_dense()

    def _rows(self, rows: slice) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The packed weight and bias of output rows `rows` (packed on first use)."""
        start, stop, _ = rows.indices(self.out_features)
        if (start, stop) not in self._packed:
            self._packed[start, stop] = _pack(self.weight[start:stop])
        return self._packed[start, stop], None if self.bias is None else self.bias[start:stop]

    def forward(self, x: torch.Tensor, rows: slice = slice(None)) -> torch.Tensor:
        """x: (..., K) bfloat16 -> (..., rows) bfloat16: output rows `rows` of the full product."""
        packed, bias = self._rows(rows)
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _pack(weight: torch.Tensor) -> torch.Tensor:
    """(N, K) bfloat16 -> the same matrix in oneDNN's layout for BATCH_HINT-row products."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), BATCH_HINT)


def packing_applies(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a model in `dtype` on `device` gets packed weights: bfloat16 on a CPU whose oneDNN runs bfloat16
    natively (avx512_bf16 or AMX; not under ONEDNN_MAX_CPU_ISA=AVX2, where bfloat16 is emulated)."""
    if dtype != torch.bfloat16 or device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return supported is not None and bool(supported()) and _ops_agree()


@functools.cache
def _ops_agree() -> bool:
    """Whether this PyTorch has the private ops the packing uses and a packed product equals F.linear's on a probe
    (within one bfloat16 rounding); else the weights stay plain (logged once)."""
    ops = ("_reorder_linear_weight", "_linear_pointwise")
    if not all(hasattr(torch.ops.mkldnn, op) for op in ops):
        log.warning("bfloat16 weights left unpacked: this PyTorch (%s) lacks oneDNN's %s", torch.__version__,
                    " and ".join(ops))
        return False
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 96, generator=gen).bfloat16()
    x = torch.randn(8, 96, generator=gen).bfloat16()
    try:
        y = torch.ops.mkldnn._linear_pointwise(x, _pack(weight), None, "none", [], "")
    except RuntimeError as exc:
        log.warning("bfloat16 weights left unpacked: oneDNN refused the packed product (%s)", exc)
        return False
    plain = torch.nn.functional.linear(x, weight)
    if y.shape != plain.shape or not torch.allclose(y.float(), plain.float(), rtol=2 ** -7, atol=1e-2):
        log.warning("bfloat16 weights left unpacked: the packed product differs from F.linear's in this PyTorch (%s)",
                    torch.__version__)
        return False
    return True


def pack_linears(model: nn.Module, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """Replace each decoder layer's fused projections (PACKED) by PackedLinear where `packing_applies`; the
    model, in place. A build whose oneDNN refuses the packing keeps the plain layers (logged)."""
    if not packing_applies(dtype, device):
        return model
    try:
        _replace(model, nn.Linear, PackedLinear)
    except RuntimeError as exc:  # pragma: no cover - a oneDNN build without the bfloat16 reorder
        log.warning("bfloat16 weights left unpacked: %s", exc)
    return model


def unpack_linears(model: nn.Module) -> nn.Module:
    """The inverse of `pack_linears`: plain nn.Linear layers again, with the same weights (in place)."""
    return _replace(model, PackedLinear, _plain)


def _plain(packed: PackedLinear) -> nn.Linear:
    weight = packed.weight
    linear = nn.Linear(packed.in_features, packed.out_features, bias=packed.bias is not None, device=weight.device,
                       dtype=weight.dtype)
    linear.weight = nn.Parameter(weight, requires_grad=False)
    if packed.bias is not None:
        linear.bias = nn.Parameter(packed.bias, requires_grad=False)
    return linear


def _replace(model: nn.Module, kind: type, make) -> nn.Module:
    """Each layer's PACKED projection of type `kind` replaced by make(it)."""
    for layer in model.layers:
        for owner in (layer.self_attn, getattr(layer, "mlp", None)):
            for name in PACKED:
                module = getattr(owner, name, None)
                if isinstance(module, kind):
                    setattr(owner, name, make(module))
    return model
