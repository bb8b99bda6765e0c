"""Which layers keep one RULER sample's needle? Retention of ILRe's selection when the query's attention
is read at each of several layers, all from one streaming pass (DCA as the engine runs it).

    .venv/bin/python bench/eval/layer_check.py niah_multikey_3 32K 1 --layers 8,15,18,19,21
"""

from __future__ import annotations

import argparse

import torch

from ilre.compressor.prefill import streaming_prefill
from ilre.compressor.prefill_config import PrefillConfig
from ilre.engine.engine import Engine, EngineConfig
from ilre.evaluation.running.metrics import retention
from ilre.evaluation.running.run_eval import allocate
from ilre.evaluation.tasks.lengths import parse_length
from ilre.evaluation.tasks.ruler import generate_sample
from ilre.kernels.query_scores import query_key_scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task")
    parser.add_argument("length", type=parse_length)
    parser.add_argument("index", type=int, nargs="?", default=0)
    parser.add_argument("--layers", default="8,15,18,19,21")
    parser.add_argument("--budget", type=int, default=1024)
    args = parser.parse_args()
    layers = tuple(sorted(int(x) for x in args.layers.split(",")))
    engine = Engine(EngineConfig())
    sample = generate_sample(engine.tokenizer, args.task, args.length, seed=0, index=args.index)
    config = engine.config.prefill
    dca = len(sample.context_ids) + len(sample.query_ids) > engine.spec.native_context  # --dca auto
    with torch.inference_mode():
        state = streaming_prefill(engine.model_at(layers[-1]), torch.tensor(sample.context_ids),
                                  torch.tensor(sample.query_ids),
                                  PrefillConfig(config.sink, config.window, config.chunk, dca), score_layers=layers)
    print(f"{args.task} {args.length} #{args.index}: {len(sample.context_ids)} context tokens, DCA {'on' if dca else 'off'}")
    for layer in layers:
        attention = query_key_scores(state.queries[layer], state.keys[layer])
        kept = allocate("ilre", attention, len(sample.context_ids), args.budget, config.sink)
        text = engine.tokenizer.decode([sample.context_ids[i] for i in sorted(kept)])
        print(f"layer {layer:2d}: retention {retention(text, sample.answers):.2f}")


if __name__ == "__main__":
    main()
