"""Where a compression's time goes: the torch profiler's operators grouped into stages.

Runs one compression (plain ILRe at l_R) of a generated passkey document on the embedded model (after a warm-up) under
torch.profiler and prints self CPU time per stage: projections (q/k/v/o and the MLP matmuls),
chunk attention, RoPE and norms and activations, cache copies, scoring, allocation.
Usage: bench/prefill_profile.py [--tokens 32768] [--dtype bfloat16] [--device cpu]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

STAGES = {  # operator name -> stage; anything else is "other"
    "aten::mm": "matmuls", "aten::addmm": "matmuls", "aten::bmm": "matmuls", "aten::matmul": "matmuls",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "chunk attention",
    "aten::_scaled_dot_product_attention_math": "chunk attention", "ilre::native_chunk_attention": "chunk attention",
    "aten::mul": "elementwise", "aten::add": "elementwise", "aten::neg": "elementwise", "aten::silu": "elementwise",
    "aten::rsqrt": "elementwise", "aten::pow": "elementwise", "aten::mean": "elementwise", "aten::exp": "elementwise",
    "aten::sub": "elementwise", "aten::div": "elementwise", "aten::maximum": "elementwise", "aten::amax": "elementwise",
    "aten::cos": "elementwise", "aten::sin": "elementwise", "aten::sum": "elementwise", "aten::log": "elementwise",
    "aten::copy_": "copies and casts", "aten::cat": "copies and casts", "aten::to": "copies and casts",
    "aten::_to_copy": "copies and casts", "aten::clone": "copies and casts", "aten::index": "copies and casts",
    "aten::embedding": "copies and casts", "aten::index_select": "copies and casts", "aten::fill_": "copies and casts",
    "onednn::qlinear_pointwise": "matmuls", "mkldnn::_linear_pointwise": "matmuls", "aten::_fused_rms_norm": "elementwise", "aten::abs": "elementwise",
    "aten::round_": "elementwise", "aten::mul_": "elementwise", "aten::add_": "elementwise", "aten::div_": "elementwise",
    "aten::sigmoid": "elementwise", "aten::lerp": "elementwise", "aten::clamp_min_": "elementwise",
    "aten::sort": "allocation", "aten::nonzero": "allocation", "aten::cumsum": "allocation",
    "aten::max_pool1d": "allocation", "aten::index_put_": "allocation",
    # kernels/layer_passes.py: a layer's norms, residual sums, SiLU product and RoPE in C
    "ilre::native_rms_norm": "elementwise", "ilre::native_residual": "elementwise",
    "ilre::native_silu_mul": "elementwise", "ilre::native_rope": "elementwise",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from ilre.engine.engine import Engine, EngineConfig
    from ilre.contract.messages import CompressRequest
    from ilre.evaluation.tasks.passkey import make_passkey_sample

    engine = Engine(EngineConfig(device=args.device, dtype=args.dtype))
    sample = make_passkey_sample(engine.tokenizer, args.tokens, 0.5, seed=7)
    request = CompressRequest(context_ids=sample.context_ids, query_ids=sample.query_ids, budget=1024, strategy="ilre")
    engine.compress(CompressRequest(context_ids=sample.context_ids[:4096], query_ids=sample.query_ids, budget=1024,
                                    strategy="ilre"))
    def profiled():  # on the engine's compute thread (engine/compute_thread.py): the profiler records the thread it is on
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            return prof, engine.compress(request)

    start = time.perf_counter()
    prof, result = engine.thread.call(profiled)
    wall = time.perf_counter() - start
    stages: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        stages[STAGES.get(event.key, "other")] += event.self_cpu_time_total / 1e6
    total = sum(stages.values())
    print(f"{args.tokens} tokens, {engine.placement.describe()}, {torch.get_num_threads()} threads, l_R={result.layer}: "
          f"{wall:.2f} s under the profiler; pipeline stages (ms): {result.timings_ms}")
    print(f"| {'stage (operators, self time)':<30} | {'seconds':>8} | {'share':>6} |")
    print(f"|{'-' * 32}|{'-' * 10}|{'-' * 8}|")
    for name, seconds in sorted(stages.items(), key=lambda kv: -kv[1]):
        print(f"| {name:<30} | {seconds:>8.2f} | {100 * seconds / total:>5.1f}% |")
    top = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:12]
    print("top operators: " + ", ".join(f"{e.key} {e.self_cpu_time_total / 1e6:.2f}s x{e.count}" for e in top))


if __name__ == "__main__":
    main()
