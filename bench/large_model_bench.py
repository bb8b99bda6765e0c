"""A Llama-3.1-8B-shaped model with random weights, truncated at l_R = 3, on any device.

What a GPU or NPU worker costs for an 8B-class model: the same streaming prefill, scoring and
allocation as `ilre compress`, on random weights (the selections mean nothing, the work is the same),
over random token ids at each length. Prints seconds, tokens/s and the peak device memory beyond
the weights. On a CPU run it with short lengths as a smoke check.
Usage: bench/large_model_bench.py --device cuda --dtype bfloat16 [--lengths 131072,1048576] [--layer 3]
"""

from __future__ import annotations

import argparse
import time


def llama_8b_config(layers: int):
    """The shapes of Llama-3.1-8B (hidden 4096, 32 heads / 8 KV heads of 128, MLP 14336, llama3 RoPE)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192},
    ) if layers else None


def random_truncated(layers: int, placement):
    """A TruncatedLM of the 8B shapes up to `layers`, weights ~ N(0, 0.02) drawn on the device."""
    import torch

    from ilre.models.llama import TruncatedLM
    from ilre.models.spec import rope_inv_freq, spec_from_config

    config = llama_8b_config(layers)
    inv_freq, scaling = rope_inv_freq(config)
    with torch.device("meta"):
        model = TruncatedLM(spec_from_config(config), layers, torch.empty(0), scaling)
    model = model.to_empty(device=placement.device).to(placement.dtype)
    generator = torch.Generator(device=placement.device).manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("layernorm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02, generator=generator)
    model.inv_freq = inv_freq.to(placement.device)
    return model.eval().requires_grad_(False).fuse()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--lengths", default="131072,1048576")
    parser.add_argument("--layer", type=int, default=3, help="l_R: the model is truncated here")
    parser.add_argument("--budget", type=int, default=1024)
    args = parser.parse_args()

    import torch

    from ilre.compressor.pipeline import SelectionJob, select
    from ilre.compressor.prefill_config import PrefillConfig
    from ilre.compressor.strategies import make_strategy
    from ilre.models.device import resolve_placement

    placement = resolve_placement(args.device, args.dtype)
    model = random_truncated(args.layer, placement)
    accelerator = getattr(torch, placement.device.type, None) if placement.device.type != "cpu" else None
    synchronize = (lambda: accelerator.synchronize()) if accelerator else (lambda: None)
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
    print(f"Llama-3.1-8B shapes, random weights, l_R = {args.layer}, {placement.describe()}, weights {weights:.2f} GiB")
    print("| context | seconds | tokens/s | peak memory beyond weights GiB | prefill s | score s | allocate s |")
    print("|---|---|---|---|---|---|---|")
    strategy, query = make_strategy("ilre"), torch.randint(0, 128256, (64,))
    for length in [int(x) for x in args.lengths.split(",") if x]:
        context = torch.randint(0, 128256, (length,), generator=torch.Generator().manual_seed(length))
        config = PrefillConfig(dca=length + 64 > 131072)
        select(model, SelectionJob(context[:4096], [query], args.budget, strategy), config)  # warm-up
        synchronize()
        if accelerator:
            accelerator.reset_peak_memory_stats()
            base = accelerator.memory_allocated()
        start = time.perf_counter()
        selection = select(model, SelectionJob(context, [query], args.budget, strategy), config)[0]
        synchronize()
        seconds = time.perf_counter() - start
        peak = (accelerator.max_memory_allocated() - base) / 2**30 if accelerator else float("nan")
        stages = selection.timings_ms
        print(f"| {length} | {seconds:.2f} | {length / seconds:.0f} | {peak:.2f} | {stages['prefill'] / 1000:.2f} | "
              f"{stages['score'] / 1000:.2f} | {stages['allocate'] / 1000:.2f} |", flush=True)


if __name__ == "__main__":
    main()
