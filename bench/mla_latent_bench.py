"""An MLA retrieval layer scored from its latent against per-head keys, on DeepSeek V3's attention shapes (128 heads,
kv_lora_rank 512, q_lora_rank 1536, qk_nope 128, qk_rope 64, v 128; hidden 1024 and 2 layers, so that it loads on
a laptop): the key cache at l_R in bytes per token, its peak over a --tokens context, the prefill's seconds, and
how far the query's logits at l_R and the kept tokens (budget --budget) are apart, both ways in the same run.

    .venv/bin/python bench/mla_latent_bench.py [--tokens 4096] [--budget 512]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

V3_ATTENTION = dict(num_attention_heads=128, num_key_value_heads=128, kv_lora_rank=512, q_lora_rank=1536,
                    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, head_dim=64)


def checkpoint(folder: Path) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("deepseek_v3", hidden_size=1024, intermediate_size=512, num_hidden_layers=2,
                                  first_k_dense_replace=2, n_routed_experts=4, num_experts_per_tok=2,
                                  moe_intermediate_size=64, n_group=1, topk_group=1, vocab_size=1000,
                                  max_position_embeddings=163840, **V3_ATTENTION)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(str(folder))
    return folder


def main() -> None:
    import torch

    from ilre.compressor.prefill import streaming_prefill
    from ilre.compressor.prefill_config import PrefillConfig
    from ilre.models.loader import read_tensors
    from ilre.models.transformers_loader import load_transformers_lm

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--budget", type=int, default=512)
    args = parser.parse_args()
    torch.set_num_threads(2)
    folder = checkpoint(Path(tempfile.mkdtemp(prefix="ilre-mla-")) / "v3-shapes")
    gen = torch.Generator().manual_seed(1)
    context, query = torch.randint(0, 1000, (args.tokens,), generator=gen), torch.randint(0, 1000, (24,), generator=gen)
    runs = {}
    for name, latent in (("per-head keys", False), ("latent", True)):
        model = load_transformers_lm(folder, 2, torch.float32, "cpu", read_tensors, latent_keys=latent)
        start = time.perf_counter()
        state = streaming_prefill(model, context, query, PrefillConfig(sink=4, window=1024, chunk=1024))
        seconds = time.perf_counter() - start
        keys, queries = state.keys[2], state.queries[2]
        group = queries.shape[0] // keys.shape[0]
        logits = torch.einsum("htd,hld->htl", queries, keys.repeat_interleave(group, 0)) / keys.shape[-1] ** 0.5
        scores = logits.softmax(-1).mean(dim=(0, 1))
        runs[name] = dict(seconds=seconds, bytes=keys.numel() * keys.element_size() / args.tokens, shape=tuple(keys.shape),
                          logits=logits, kept=set(scores.topk(args.budget).indices.tolist()))
    a, b = runs["per-head keys"], runs["latent"]
    print(f"\nDeepSeek V3's attention shapes, l_R = 2, {args.tokens} tokens, float32, 2 threads")
    print("| l_R's key cache | shape | bytes per token | for 128K tokens | prefill s |")
    print("|---|---|---|---|---|")
    for name, run in runs.items():
        print(f"| {name} | {run['shape']} | {run['bytes']:,.0f} | {run['bytes'] * 131072 / 2**30:.2f} GiB | "
              f"{run['seconds']:.2f} |")
    print(f"latent {a['bytes'] / b['bytes']:.1f}x smaller; logits apart by at most "
          f"{(a['logits'] - b['logits']).abs().max().item():.2e} (largest {a['logits'].abs().max().item():.1f}); "
          f"top-{args.budget} by mean attention shared: {len(a['kept'] & b['kept']) / args.budget:.1%}")


if __name__ == "__main__":
    main()
