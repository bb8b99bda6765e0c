"""How much of float32's selection another `--dtype` keeps, on texts the suite does not generate the same way:
passkeys in Shakespeare at five depths, and a fact planted in Python's reference text.

Per sample and dtype, one engine's first question (no cache): plain ILRe at the profile's fast layer (the
speed row's path) and the default cascade. Printed: the share of float32's kept indices each dtype keeps,
whether each keeps the needle, and the seconds of each (one thread each, as `make bench` runs). float32's
selections are made with PyTorch's attention kernels; `--kernels torch,run` measures each dtype with those
and with the chunk attention the prefill runs (the C kernel where it is preferred: kernels/native_attention.py).

`--source tasks`: the evaluation's 18 RULER-style tasks instead (`ilre eval`'s generator, one sample each at a seed
the evaluation does not use); "kept" there is every answer's text in the kept tokens (the evaluation's retention),
else the share of the answers kept. Engines run a first question as `ilre serve` and `ilre batch` do (streams held:
the default's candidates from its coarse stream), nothing deepened.

    .venv/bin/python bench/dtype_agreement.py [--tokens 8000] [--dtypes int8] [--budget 1024] [--paths plain,default]
        [--kernels torch,run] [--source texts|tasks]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stream_agreement import samples  # noqa: E402

import ilre.kernels.chunk_attention as attention  # noqa: E402
from ilre.contract.messages import CompressRequest  # noqa: E402
from ilre.engine.engine import Engine, EngineConfig  # noqa: E402
from ilre.kernels.native_attention import native_preferred  # noqa: E402

PATHS = {"plain": {"strategy": "ilre", "layer": "fast"}, "default": {}}
KERNELS = {"torch": lambda dtype: False, "run": native_preferred}  # PyTorch's chunk attention, or as the prefill runs
KERNEL_NAMES = {"torch": " (PyTorch's attention)", "run": ""}
TASK_SEED = 9100  # --source tasks: the evaluation's runs use seeds from 0


def spanned(a: int, b: int) -> Callable[[set[int]], str]:
    """Whether the kept indices hold the needle's span [a, b)."""
    return lambda kept: "kept" if all(i in kept for i in range(a, b)) else "LOST"


def task_samples(engine: Engine, tokens: int) -> list[tuple[str, list[int], list[int], Callable[[set[int]], str]]]:
    """The evaluation's tasks, one sample each at a seed its runs do not use: (name, context, query, answers kept)."""
    from ilre.evaluation.running.metrics import retention
    from ilre.evaluation.tasks.ruler import TASKS, generate_sample

    def answered(context: list[int], answers: list[str]) -> Callable[[set[int]], str]:
        def share(kept: set[int]) -> str:
            got = retention(engine.tokenizer.decode([context[i] for i in sorted(kept)]), answers)
            return "kept" if got == 1.0 else f"{got:.0%}"
        return share

    out = []
    for task in TASKS:
        s = generate_sample(engine.tokenizer, task, tokens, TASK_SEED, 0)
        out.append((task, list(s.context_ids), list(s.query_ids), answered(list(s.context_ids), s.answers)))
    return out


def selections(dtype: str, data: list, budget: int, paths: list[str], kernel: str = "run"
               ) -> dict[tuple[str, str], tuple[set[int], float]]:
    """(path, sample name) -> (kept indices, seconds), one engine without a document cache, its chunk attention
    `kernel` (KERNELS)."""
    attention.native_preferred = KERNELS[kernel]
    engine = Engine(EngineConfig(dtype=dtype, doc_cache_mb=0, hold_streams=True))
    out = {}
    for path in paths:
        extra = PATHS[path]
        for name, context, query, _ in data:
            start = time.perf_counter()
            result = engine.compress(CompressRequest(context_ids=context, query_ids=query, budget=budget, **extra))
            out[path, name] = set(result.kept_indices), time.perf_counter() - start
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8000)
    parser.add_argument("--budget", type=int, default=1024)
    parser.add_argument("--dtypes", default="int8", help="compared with float32")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"of {', '.join(PATHS)}")
    parser.add_argument("--kernels", default="torch,run", help=f"of {', '.join(KERNELS)}: each dtype with each")
    parser.add_argument("--source", default="texts", choices=("texts", "tasks"))
    args = parser.parse_args()
    paths = [p for p in args.paths.split(",") if p]
    if not paths or any(p not in PATHS for p in paths):
        parser.error(f"--paths: each one of {', '.join(PATHS)} (got {args.paths!r})")
    kernels = [k for k in args.kernels.split(",") if k]
    if not kernels or any(k not in KERNELS for k in kernels):
        parser.error(f"--kernels: each one of {', '.join(KERNELS)} (got {args.kernels!r})")
    engine = Engine(EngineConfig(doc_cache_mb=0))
    data = ([(name, context, query, spanned(*span)) for name, context, query, span in samples(engine, args.tokens)]
            if args.source == "texts" else task_samples(engine, args.tokens))
    base = selections("float32", data, args.budget, paths, "torch")
    print(f"{args.tokens} tokens, budget {args.budget}; share of float32's kept indices, needle, seconds (float32's)")
    print("| dtype | path | " + " | ".join(name for name, *_ in data) + " | mean |")
    print("|---|---|" + "---|" * (len(data) + 1))
    for dtype, kernel in [(d, k) for d in args.dtypes.split(",") if d for k in kernels]:
        got = selections(dtype, data, args.budget, paths, kernel)
        for path in paths:
            cells, shares = [], []
            for name, _, _, needle_kept in data:
                kept, seconds = got[path, name]
                want, base_seconds = base[path, name]
                shares.append(len(kept & want) / len(want))
                needle = needle_kept(kept)
                cells.append(f"{shares[-1]:.1%} {needle} {seconds:.1f} s ({base_seconds:.1f})")
            print(f"| {dtype}{KERNEL_NAMES[kernel]} | {path} | " + " | ".join(cells) + f" | {sum(shares) / len(shares):.1%} |", flush=True)


if __name__ == "__main__":
    main()
