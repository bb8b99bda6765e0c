"""The family's own transformers layers (`--decoder transformers`) against the hand-tuned decoder (`--decoder fast`)
on the embedded SmolLM2, in float32, side by side in one run: a first question over --tokens (passkey, budget 1024)
by plain ILRe at l_R and by the default, each path in a fresh process (the other's memory not in it): the median of
--repeats runs after a warm-up, the peak resident memory the requests added over the loaded engine, and the share
of kept tokens both paths keep.

    .venv/bin/python bench/decoder_paths_bench.py [--tokens 32768] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

DECODERS = ("fast", "transformers")


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as status:
        return int(next(l for l in status if l.startswith(field + ":")).split()[1]) / 1024.0


def one_path(decoder: str, tokens: int, repeats: int) -> dict:
    """In this process: the engine on `decoder`, its requests' seconds, kept indices and memory."""
    from layer_passes_bench import first_questions

    from ilre.engine.engine import Engine, EngineConfig
    from ilre.contract.messages import CompressRequest

    engine = Engine(EngineConfig(decoder=decoder, dtype="float32", doc_cache_mb=0))
    sample, jobs = first_questions(engine, tokens)
    engine.compress(CompressRequest(context_ids=sample.context_ids[:2048], query_ids=sample.query_ids, budget=256))
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    loaded = _status_mib("VmRSS")
    out = {"model": type(engine.model_at(engine.layer)).__name__, "loaded_mib": loaded, "requests": {}}
    for name, request in jobs.items():
        seconds, kept = [], None
        for _ in range(repeats):
            start = time.perf_counter()
            reply = engine.compress(request)
            seconds.append(time.perf_counter() - start)
            kept = list(reply.kept_indices)
        out["requests"][name] = {"seconds": seconds, "kept": kept}
    out["peak_over_loaded_mib"] = _status_mib("VmHWM") - loaded
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--one", choices=DECODERS, help=argparse.SUPPRESS)  # the child process's path
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_path(args.one, args.tokens, args.repeats)))
        return
    runs = {}
    for decoder in DECODERS:
        done = subprocess.run([sys.executable, __file__, "--one", decoder, "--tokens", str(args.tokens),
                               "--repeats", str(args.repeats)], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"--decoder {decoder} failed:\n{done.stderr[-3000:]}")
        runs[decoder] = json.loads(done.stdout.strip().splitlines()[-1])
    fast, generic = runs["fast"], runs["transformers"]
    print(f"\n{args.tokens} tokens, embedded SmolLM2, float32, each path in its own process, median of "
          f"{args.repeats} after a warm-up ({fast['model']} vs {generic['model']})")
    print("| request | fast s | transformers s | ratio | kept tokens shared |")
    print("|---|---|---|---|---|")
    for name in fast["requests"]:
        a = statistics.median(fast["requests"][name]["seconds"])
        b = statistics.median(generic["requests"][name]["seconds"])
        kept_a, kept_b = set(fast["requests"][name]["kept"]), set(generic["requests"][name]["kept"])
        print(f"| {name} | {a:.2f} | {b:.2f} | {b / a:.2f}x | {len(kept_a & kept_b) / max(len(kept_a), 1):.1%} |")
    print(f"| memory the requests added over the loaded engine (MiB) | {fast['peak_over_loaded_mib']:.0f} | "
          f"{generic['peak_over_loaded_mib']:.0f} | {generic['peak_over_loaded_mib'] / fast['peak_over_loaded_mib']:.2f}x | |")
    print(f"| the loaded engine (MiB) | {fast['loaded_mib']:.0f} | {generic['loaded_mib']:.0f} | | |")


if __name__ == "__main__":
    main()
