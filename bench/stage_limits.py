"""Each stage of a first question against its own limit, measured in the same run.

One compression of a --tokens passkey document (budget 1024) per strategy: the default (the cascade) and plain ILRe at
l_R, on the embedded model after a warm-up, under torch.profiler with the operators' shapes. Operators are grouped into
stages as bench/prefill_profile.py groups them; per stage: self time, the work it did (FLOPs of the matmuls and of
the chunk attention from their shapes, or counted around the C kernel's calls; bytes read and written for the passes
that only move data, the C layer passes' counted around their calls), the rate, the stage's limit (the matmul peak
of its operands' dtype on the model's own shapes, or the memory bandwidth), and its share of that limit (the time the
limit allows over the time taken). Then the whole request's useful FLOPs over its time, as a share of the matmul
peak of the request's dtype. The limits are measured first, in this process:
    matmul peak: (1024, 576) @ (576, 3072), the MLP's gate/up shape, in float32, bfloat16 (the faster of a plain
                 product and the packed weight's, models/packed_linear.py) and int8 (oneDNN's int8 linear on an
                 already quantized input);
    bandwidth:   a 12 MiB float32 copy, the size of a chunk's largest activation (1024 x 3072): what a pass over
                 one chunk's tensors can move (bytes read + written over its time).
Shares are of the profiled run's self times; the whole request is timed again without the profiler. Each strategy
runs twice in turn: with the C layer passes (kernels/layer_passes.py) and with PyTorch's operators in their place.
Usage: bench/stage_limits.py [--tokens 32768] [--dtype auto] [--strategies default,ilre] [--passes c,torch]
With ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 in the environment it measures
what a CPU without AVX-512 runs (`--dtype auto` is int8 there).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prefill_profile import STAGES  # noqa: E402

SIZES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8, "int": 4, "bool": 1,
         "unsigned char": 1, "signed char": 1, "short int": 2}
PASSES = {"c": "the C layer passes", "torch": "PyTorch's operators for the elementwise passes"}
MOVES = {"copies and casts", "elementwise"}  # stages whose limit is the memory bandwidth
COMPOSITE = {"aten::to", "aten::_to_copy", "aten::clone"}  # their bytes are their copy_'s, counted there


def best_s(fn, repeats: int = 5) -> float:
    """Best wall time of `fn()` over `repeats` calls, after one warm-up."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def limits(own: str) -> dict[str, float]:
    """The limits: GFLOP/s per operand dtype ("float" and `own`: the request's, "c10::BFloat16" or "int8") and
    "bandwidth" in GB/s."""
    import torch

    from ilre.models.int8 import Int8Linear, int8_available, quantize_tokens
    from ilre.models.packed_linear import PackedLinear, packing_applies

    m, k, n = 1024, 576, 3072
    out = {}
    for name, dtype in (("float", torch.float32), ("c10::BFloat16", torch.bfloat16)):
        if name not in ("float", own):
            continue
        a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
        fastest = best_s(lambda: a @ b)
        if packing_applies(dtype, torch.device("cpu")):  # the packed weight the model runs, when that is faster
            packed = PackedLinear(torch.nn.Linear(k, n, bias=False, dtype=dtype))
            fastest = min(fastest, best_s(lambda: packed(a)))
        out[name] = 2 * m * k * n / fastest / 1e9
    if own == "int8" and int8_available():
        linear, x = Int8Linear(torch.randn(n, k)), torch.randn(m, k)
        _, quantized = quantize_tokens(x)
        packed, w_scale, w_zero = linear._rows(slice(None))
        qlinear = lambda: torch.ops.onednn.qlinear_pointwise(  # noqa: E731
            quantized, 1.0, 128, packed, w_scale, w_zero, None, 1.0, 0, torch.float32, "none", [], "")
        out["int8"] = 2 * m * k * n / best_s(qlinear) / 1e9
    src, dst = torch.randn(m, n), torch.empty(m, n)
    out["bandwidth"] = 2 * src.numel() * 4 / best_s(lambda: dst.copy_(src), 20) / 1e9
    return out


def tensor_bytes(event) -> list[int]:
    """Bytes of each tensor input of a profiler event (from its recorded shapes and dtypes)."""
    sizes = []
    for shape, dtype in zip(event.input_shapes, event.input_dtypes):
        if shape and dtype in SIZES:
            count = 1
            for dim in shape:
                count *= dim
            sizes.append(count * SIZES[dtype])
    return sizes


def work(event) -> tuple[float, float, str]:
    """(FLOPs, bytes, limit key) of one operator from its shapes; (0, 0, "") for what is not counted."""
    name, shapes = event.name, event.input_shapes
    if name == "aten::mm":
        (m, k), (_, n) = shapes[0], shapes[1]
        return 2.0 * m * k * n, 0.0, event.input_dtypes[0]
    if name == "aten::addmm":
        (m, k), (_, n) = shapes[1], shapes[2]
        return 2.0 * m * k * n, 0.0, event.input_dtypes[1]
    if name == "aten::bmm":
        (b, m, k), (_, _, n) = shapes[0], shapes[1]
        return 2.0 * b * m * k * n, 0.0, event.input_dtypes[0]
    if name == "onednn::qlinear_pointwise":
        (m, k), (n,) = shapes[0][-2:], shapes[4]
        return 2.0 * m * k * n, 0.0, "int8"
    if name == "mkldnn::_linear_pointwise":  # models/packed_linear.py: x (..., K) by a packed (N, K) weight
        rows = 1
        for dim in shapes[0][:-1]:
            rows *= dim
        return 2.0 * rows * shapes[0][-1] * shapes[1][0], 0.0, event.input_dtypes[0]
    if name == "aten::_scaled_dot_product_flash_attention_for_cpu":
        _, heads, lq, d = shapes[0]
        lk = shapes[1][2]
        causal = bool(event.concrete_inputs[4]) if len(event.concrete_inputs) > 4 else False
        pairs = lq * lk - (lq * (lq - 1) // 2 if causal else 0)
        return 4.0 * heads * d * pairs, 0.0, event.input_dtypes[0]
    if STAGES.get(name) in MOVES and name not in COMPOSITE:
        sizes = tensor_bytes(event)
        if not sizes:
            return 0.0, 0.0, ""
        written = 0 if name.endswith("_") else max(sizes)  # in place (copy_ included): the output is an input
        return 0.0, float(sum(sizes) + written), "bandwidth"
    return 0.0, 0.0, ""


class NativeAttentionWork:
    """The C chunk attention's FLOPs (4 * d per visible score element) and its operands' dtype, counted around its
    calls while in the `with`: it runs outside PyTorch's operators, so the profiler times it (its record_function
    row) but records no shapes."""

    def __enter__(self) -> "NativeAttentionWork":
        import torch

        import ilre.kernels.chunk_attention as module

        self.flops, self.key, self.module = 0.0, "", module
        self.inner = getattr(module, "native_chunk_attention", None)  # None: a tree without the C kernel
        if self.inner is None:
            return self

        def counted(q, k, v, n_prefix, visible=None, rows=None):
            out = self.inner(q, k, v, n_prefix, visible, rows)
            if out is not None:
                heads, n_rows, d = q.shape
                seen = n_prefix if visible is None else int(visible.sum())
                own = n_rows * (n_rows + 1) // 2 if rows is None else int((rows + 1).sum())
                self.flops += 4.0 * heads * d * (n_rows * seen + own)
                self.key = "c10::BFloat16" if q.dtype == torch.bfloat16 else "float"
            return out

        module.native_chunk_attention = counted
        return self

    def __exit__(self, *exc) -> None:
        if self.inner is not None:
            self.module.native_chunk_attention = self.inner

    def add_to(self, stages: dict[str, dict[str, float]], peaks: dict[str, float]) -> float:
        """Its FLOPs and their limit added to the chunk attention stage; returns the FLOPs."""
        if self.flops:
            row = stages["chunk attention"]
            row["flops"] += self.flops
            row["limit_s"] += self.flops / (peaks.get(self.key, peaks["float"]) * 1e9)
        return self.flops


class NativePassBytes:
    """Bytes read and written by the C layer passes (kernels/layer_passes.py), counted around their calls while in the
    `with`: like the C attention they run outside PyTorch's operators (their record_function rows carry no shapes)."""

    NAMES = ("rms_norm", "residual", "silu_mul", "rope_heads")

    def __enter__(self) -> "NativePassBytes":
        import ilre.kernels.layer_passes as module

        self.bytes, self.module = 0.0, module
        self.inner = {name: getattr(module, name) for name in self.NAMES if hasattr(module, name)}

        def counted(inner):
            def call(*args, **kwargs):
                out = inner(*args, **kwargs)
                if out is not None:
                    tensors = [t for t in (*args, *(out if isinstance(out, tuple) else (out,))) if hasattr(t, "nbytes")]
                    self.bytes += sum(t.nbytes for t in tensors if t.dim() > 1)  # its operands, not weights or tables
                return out
            return call

        for name, inner in self.inner.items():
            setattr(module, name, counted(inner))
        return self

    def __exit__(self, *exc) -> None:
        for name, inner in self.inner.items():
            setattr(self.module, name, inner)

    def add_to(self, stages: dict[str, dict[str, float]], peaks: dict[str, float]) -> None:
        """Its bytes and their limit added to the elementwise stage."""
        if self.bytes:
            row = stages["elementwise"]
            row["bytes"] += self.bytes
            row["limit_s"] += self.bytes / (peaks["bandwidth"] * 1e9)


def profile_request(engine, request):
    """(the profiler, the CompressResult) of one compression, profiled on the engine's compute thread."""
    from torch.profiler import ProfilerActivity, profile

    def profiled():  # on the engine's compute thread: the profiler records the thread it is entered on
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            return prof, engine.compress(request)

    return engine.thread.call(profiled)


def stage_table(prof, peaks: dict[str, float]) -> tuple[dict[str, dict[str, float]], float]:
    """Per stage {seconds, flops, bytes, limit_s} and the request's useful FLOPs (matmuls + attention)."""
    stages: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    useful = 0.0
    for event in prof.events():
        stage = STAGES.get(event.name, "other")
        row = stages[stage]
        row["seconds"] += event.self_cpu_time_total / 1e6
        flops, moved, key = work(event)
        row["flops"] += flops
        row["bytes"] += moved
        useful += flops
        if key == "bandwidth":
            row["limit_s"] += moved / (peaks["bandwidth"] * 1e9)
        elif key:
            row["limit_s"] += flops / (peaks.get(key, peaks["float"]) * 1e9)
    return stages, useful


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--strategies", default="default,ilre")
    parser.add_argument("--passes", default="c,torch",
                        help="the layer's elementwise passes: c (kernels/layer_passes.py), torch (PyTorch's operators, "
                        "ILRE_NATIVE_PASSES=0), or both in turn")
    args = parser.parse_args()

    import torch

    from ilre.engine.engine import Engine, EngineConfig
    from ilre.evaluation.tasks.passkey import make_passkey_sample

    engine = Engine(EngineConfig(dtype=args.dtype, doc_cache_mb=0))
    placement = engine.placement.describe()
    own = next((key for word, key in (("bfloat16", "c10::BFloat16"), ("int8", "int8")) if word in placement), "float")
    peaks = limits(own)
    print(f"{args.tokens} tokens, {placement}, {torch.get_num_threads()} threads; limits measured now: matmul "
          + ", ".join(f"{k.removeprefix('c10::')} {v:,.0f} GFLOP/s" for k, v in peaks.items() if k != "bandwidth")
          + f" on (1024, 576) @ (576, 3072); bandwidth {peaks['bandwidth']:.1f} GB/s (a 12 MiB copy)")
    sample = make_passkey_sample(engine.tokenizer, args.tokens, 0.5, seed=7)
    for name in args.strategies.split(","):
        for passes in args.passes.split(","):
            os.environ["ILRE_NATIVE_PASSES"] = "1" if passes == "c" else "0"  # read at each call (layer_passes.enabled)
            report(engine, sample, name, peaks, own, PASSES[passes])
    os.environ.pop("ILRE_NATIVE_PASSES")


def report(engine, sample, name: str, peaks: dict[str, float], own: str, passes: str) -> None:
    """One strategy's stage table and whole-request line."""
    from ilre.contract.messages import CompressRequest

    # the default as `ilre serve` and `ilre batch` run a first question: its candidates from its own stream
    strategy = {"strategy_options": {"first_from_stream": True}} if name == "default" else {"strategy": name}
    ask = lambda ids: CompressRequest(context_ids=ids, query_ids=sample.query_ids, budget=1024,  # noqa: E731
                                      **strategy)
    engine.compress(ask(sample.context_ids[:4096]))  # warm-up: packing, first-call allocations
    with NativeAttentionWork() as native, NativePassBytes() as moved:
        prof, result = profile_request(engine, ask(sample.context_ids))
    stages, useful = stage_table(prof, peaks)
    useful += native.add_to(stages, peaks)
    moved.add_to(stages, peaks)
    start = time.perf_counter()
    engine.compress(ask(sample.context_ids))
    wall = time.perf_counter() - start
    label = "default (cascade)" if name == "default" else f"plain {name}"
    total = sum(row["seconds"] for row in stages.values())
    print(f"\n{label} at l_R={result.layer}, {passes}: {wall:.2f} s ({total:.2f} s of operators under the profiler)")
    print("| stage | seconds | share | work | rate | limit | share of the limit |")
    print("|---|---|---|---|---|---|---|")
    for stage, row in sorted(stages.items(), key=lambda kv: -kv[1]["seconds"]):
        if row["flops"]:
            amount, rate = f"{row['flops'] / 1e9:,.0f} GFLOP", f"{row['flops'] / row['seconds'] / 1e9:,.0f} GFLOP/s"
            limit = "matmul peak"
        elif row["bytes"]:
            amount, rate = f"{row['bytes'] / 1e9:,.1f} GB", f"{row['bytes'] / row['seconds'] / 1e9:,.1f} GB/s"
            limit = "bandwidth"
        else:
            amount = rate = limit = "-"
        share = f"{100 * row['limit_s'] / row['seconds']:.0f}%" if row["limit_s"] else "-"
        print(f"| {stage} | {row['seconds']:.2f} | {100 * row['seconds'] / total:.0f}% | {amount} | {rate} | "
              f"{limit} | {share} |")
    print(f"whole request: {useful / 1e9:,.0f} GFLOP in {wall:.2f} s = {useful / wall / 1e9:,.0f} GFLOP/s, "
          f"{100 * useful / wall / 1e9 / peaks.get(own, peaks['float']):.0f}% of the {own.removeprefix('c10::')} "
          f"matmul peak", flush=True)

if __name__ == "__main__":
    main()
