"""The C chunk-attention kernel against dense float64 masked attention and PyTorch's kernels (`torch_chunk_attention`)."""

from __future__ import annotations

import math

import pytest
import torch

from ilre.kernels.chunk_attention import torch_chunk_attention
from ilre.kernels.native_attention import available, native_chunk_attention
from ilre.kernels.native_build import compiler

# where a C compiler exists a failed build fails these tests (the first names why); with none, PyTorch's kernels run
# and there is nothing of C to test
pytestmark = pytest.mark.skipif(compiler() is None, reason="no C compiler (gcc) on this machine")

F32_ATOL = 1e-5


def dense_reference(q, k, v, n_prefix, visible=None, rows=None):
    """q: (H, R, d); k, v: (KV, P + C, d) -> (H, R, d) float64, from an explicit (R, P + C) mask."""
    n_chunk = k.shape[1] - n_prefix
    pos = torch.arange(n_chunk) if rows is None else rows
    mask = torch.zeros(pos.numel(), n_prefix + n_chunk, dtype=torch.bool)
    mask[:, :n_prefix] = True if visible is None else visible.bool()
    mask[:, n_prefix:] = torch.arange(n_chunk).unsqueeze(0) <= pos.unsqueeze(1)
    group = q.shape[0] // k.shape[0]
    k_rep, v_rep = k.double().repeat_interleave(group, 0), v.double().repeat_interleave(group, 0)
    logits = (q.double() @ k_rep.transpose(1, 2)) / math.sqrt(q.shape[-1])
    return torch.softmax(logits.masked_fill(~mask, -math.inf), -1) @ v_rep


CASES = {  # name: (heads, kv_heads, d, n_prefix, n_chunk, prefix holes, subset of rows)
    "gqa_no_prefix": (9, 3, 64, 0, 150, False, False),
    "gqa_prefix": (9, 3, 64, 90, 130, False, False),
    "mha_prefix": (4, 4, 64, 70, 100, False, False),
    "mha_no_prefix": (4, 4, 64, 0, 65, False, False),
    "gqa_holes": (9, 3, 64, 100, 80, True, False),
    "gqa_rows": (9, 3, 64, 60, 120, False, True),
    "mha_holes_rows": (4, 4, 64, 40, 90, True, True),
    "d32_prefix": (9, 3, 32, 50, 70, False, False),
    "d32_no_prefix": (4, 4, 32, 0, 33, False, False),
    "d32_holes_rows": (9, 3, 32, 30, 50, True, True),
    "single_row": (9, 3, 64, 0, 1, False, False),
    "d40_odd_sizes": (6, 2, 40, 13, 7, True, False),
}


def make_inputs(case: str, dtype: torch.dtype):
    heads, kv_heads, dim, n_prefix, n_chunk, holes, subset = CASES[case]
    gen = torch.Generator().manual_seed(sum(map(ord, case)))
    q = torch.randn(heads, n_chunk, dim, generator=gen)
    k = torch.randn(kv_heads, n_prefix + n_chunk, dim, generator=gen)
    v = torch.randn(kv_heads, n_prefix + n_chunk, dim, generator=gen)
    visible = (torch.rand(n_prefix, generator=gen) < 0.6) if holes else None
    rows = None
    if subset:
        rows = torch.sort(torch.randperm(n_chunk, generator=gen)[: n_chunk // 3]).values
        q = q[:, rows].contiguous()
    return q.to(dtype), k.to(dtype), v.to(dtype), n_prefix, visible, rows


@pytest.mark.parametrize("case", sorted(CASES))
def test_float32_equals_dense_and_chunk_attention(case):
    q, k, v, n_prefix, visible, rows = make_inputs(case, torch.float32)
    got = native_chunk_attention(q, k, v, n_prefix, visible, rows)
    assert got is not None and got.dtype == torch.float32 and got.shape == q.shape
    ref = dense_reference(q, k, v, n_prefix, visible, rows)
    assert (got.double() - ref).abs().max().item() <= F32_ATOL
    torch.testing.assert_close(got, torch_chunk_attention(q, k, v, n_prefix, visible, rows), atol=F32_ATOL, rtol=0)


@pytest.mark.parametrize("case", sorted(CASES))
def test_bfloat16_no_worse_than_torch(case):
    q, k, v, n_prefix, visible, rows = make_inputs(case, torch.bfloat16)
    got = native_chunk_attention(q, k, v, n_prefix, visible, rows)
    assert got is not None and got.dtype == torch.bfloat16 and got.shape == q.shape
    ref = dense_reference(q, k, v, n_prefix, visible, rows)  # from the same bf16 inputs
    torch_out = torch_chunk_attention(q, k, v, n_prefix, visible, rows)
    err_torch = (torch_out.double() - ref).abs().max().item()
    err_native = (got.double() - ref).abs().max().item()
    tol = max(1.5 * err_torch, 2.0**-9)  # one bf16 rounding of a unit-scale output
    assert err_native <= tol, (err_native, err_torch)
    # each within its error of the reference: they may round to neighbouring bf16 values, not further
    assert (got.double() - torch_out.double()).abs().max().item() <= tol + err_torch


def test_every_prefix_entry_masked_leaves_the_chunk():
    # no visible prefix entry: the first row sees only its own key, so it returns its own value
    q, k, v = torch.randn(4, 3, 16), torch.randn(2, 8, 16), torch.randn(2, 8, 16)
    got = native_chunk_attention(q, k, v, 5, torch.zeros(5, dtype=torch.bool))
    torch.testing.assert_close(got[:, 0], v[:, 5].repeat_interleave(2, 0), atol=1e-6, rtol=0)
    torch.testing.assert_close(got, dense_reference(q, k, v, 5, torch.zeros(5)).float(), atol=F32_ATOL, rtol=0)


def test_large_logits_stay_finite():
    # scores of +-hundreds: the online softmax rescales without overflow or NaN
    gen = torch.Generator().manual_seed(3)
    q = 40 * torch.randn(3, 70, 64, generator=gen)
    k, v = torch.randn(3, 100, 64, generator=gen), torch.randn(3, 100, 64, generator=gen)
    got = native_chunk_attention(q, k, v, 30)
    assert torch.isfinite(got).all()
    assert (got.double() - dense_reference(q, k, v, 30)).abs().max().item() <= 1e-4


def test_threads_do_not_change_the_result():
    q, k, v, n_prefix, visible, rows = make_inputs("gqa_prefix", torch.bfloat16)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native_chunk_attention(q, k, v, n_prefix, visible, rows)
        torch.set_num_threads(2)
        two = native_chunk_attention(q, k, v, n_prefix, visible, rows)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_non_contiguous_inputs():
    q, k, v, n_prefix, visible, rows = make_inputs("gqa_prefix", torch.float32)
    qt = q.transpose(0, 1).contiguous().transpose(0, 1)  # same values, other strides
    assert not qt.is_contiguous()
    torch.testing.assert_close(native_chunk_attention(qt, k, v, n_prefix), native_chunk_attention(q, k, v, n_prefix))


def test_returns_none_where_it_does_not_apply():
    q, k, v = torch.randn(2, 4, 8), torch.randn(1, 4, 8), torch.randn(1, 4, 8)
    assert native_chunk_attention(q.half(), k.half(), v.half(), 0) is None
    assert native_chunk_attention(q.double(), k.double(), v.double(), 0) is None
    assert native_chunk_attention(q, k.bfloat16(), v, 0) is None
    meta = [t.to("meta") for t in (q, k, v)]
    assert native_chunk_attention(*meta, 0) is None


def test_the_build_reports_whether_it_is_the_faster():
    # AVX-512, or AVX2 and FMA (ATEN_CPU_CAPABILITY=avx2 builds for x86-64-v3); not an x86-64-v2 build
    from ilre.kernels import native_attention, native_build

    flags, cpu = native_build.compile_flags(), set(native_build.cpu_flags().split())
    native = "-march=native" in flags and ("avx512f" in cpu or {"avx2", "fma"} <= cpu)
    assert native_attention._fast == (native or "-march=x86-64-v3" in flags)


def test_one_openmp_runtime_in_the_process():
    # the kernel runs on torch's libgomp (linked by path): no second OpenMP runtime gets mapped
    assert available()
    with open("/proc/self/maps") as maps:
        gomps = {line.split()[-1] for line in maps if "libgomp" in line}
    assert len(gomps) <= 1, gomps


def test_the_prefill_runs_it_where_it_is_the_faster(monkeypatch):
    # float32 always and bfloat16 without AMX tiles (PyTorch's flash kernel runs its products on them), where the
    # build is the faster one (AVX-512, or AVX2 and FMA)
    from ilre.kernels import native_attention

    def preferred(flags: str, fast: bool = True) -> tuple[bool, bool]:
        monkeypatch.setattr(native_attention, "_cpu_flags", lambda: flags)
        monkeypatch.setattr(native_attention, "_fast", fast)
        native_attention.native_preferred.cache_clear()
        return native_attention.native_preferred(torch.float32), native_attention.native_preferred(torch.bfloat16)

    try:
        assert preferred("flags : fpu avx512f avx512_bf16") == (True, True)
        assert preferred("flags : fpu avx512f avx512_bf16 amx_bf16 amx_tile") == (True, False)
        assert preferred("flags : fpu avx2 fma") == (True, True)  # an x86-64-v3 build
        assert preferred("flags : fpu sse4_2", fast=False) == (False, False)  # an x86-64-v2 build
        assert not native_attention.native_preferred(torch.float16)
    finally:
        native_attention.native_preferred.cache_clear()
