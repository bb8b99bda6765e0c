"""How one request travels through the compressor's modules: each time control enters a module from another (a call
from outside it), counted per module, for one question through the pipeline's entry point (`select`; `select_context`
on a tree before it) with the default cascade on the embedded model. A module entered many times is one the request
goes back and forth through. Loops over layers and chunks enter the same modules once per turn: those are counted
once per calling line (a prefill's per-chunk calls into the model are one entry of the model).

    .venv/bin/python bench/request_path.py [--tokens 4096] [--budget 512] [--task niah_single_1]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from ilre.engine.engine import Engine, EngineConfig  # noqa: E402
from ilre.evaluation.tasks.ruler import generate_sample  # noqa: E402

try:
    from ilre.contract.messages import CompressRequest  # noqa: E402
except ImportError:  # the tree before the contract's own package
    from ilre.engine.messages import CompressRequest  # type: ignore[no-redef]  # noqa: E402

PACKAGE = "ilre."


def module_of(frame) -> str | None:
    name = frame.f_globals.get("__name__", "")
    return name if name.startswith(PACKAGE) else None


def trace(run) -> tuple[Counter, Counter, list[str]]:
    """Run `run()` and count, per ilre module, the calls that enter it from another module (one per calling line of
    the caller, so a loop's turns count once) and those of them that come back into a module already on the call
    stack (a call back up); the order in which modules were first entered."""
    entries: Counter = Counter()
    back: Counter = Counter()
    seen: set[tuple[str, str, int]] = set()
    order: list[str] = []

    def profile(frame, event, arg):
        if event != "call":
            return
        callee = module_of(frame)
        caller = frame.f_back
        while caller is not None and module_of(caller) is None and caller.f_globals.get("__name__", "").startswith(
                ("torch", "contextlib", "functools", "dataclasses", "abc", "typing")):
            caller = caller.f_back  # through the libraries' wrappers (inference_mode, dataclass methods)
        source = module_of(caller) if caller is not None else None
        if callee is None or source is None or callee == source:
            return
        site = (callee, source, caller.f_lineno)
        if site in seen:
            return
        seen.add(site)
        entries[callee] += 1
        above = caller.f_back
        while above is not None:
            if module_of(above) == callee:
                back[callee] += 1
                break
            above = above.f_back
        if callee not in order:
            order.append(callee)

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return entries, back, order


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--budget", type=int, default=512)
    parser.add_argument("--task", default="niah_single_1")
    args = parser.parse_args()
    torch.set_num_threads(1)
    engine = Engine(EngineConfig(dtype="float32", doc_cache_mb=0))
    sample = generate_sample(engine.tokenizer, args.task, args.tokens, seed=9300)
    job = engine.prepare(CompressRequest(context_ids=sample.context_ids, query_ids=sample.query_ids, budget=args.budget))
    try:
        from ilre.compressor.pipeline import SelectionJob, select

        def run():
            return select(job.model, SelectionJob(job.context_ids, job.queries, job.budget, job.strategy, job.units),
                          job.prefill)
        entry = "select"
    except ImportError:
        from ilre.compressor.pipeline import select_context

        def run():
            return select_context(job.model, job.context_ids, job.queries[0], job.budget, job.strategy, job.prefill,
                                  units=job.units)
        entry = "select_context"
    run()  # warm: the kernels' first calls
    entries, back, order = trace(run)
    compressor = [m for m in order if m.startswith("ilre.compressor.")]
    print(f"one question from {entry}, {args.task} at {args.tokens} tokens, budget {args.budget}, the default cascade")
    print("| module | entries from another module | of them calls back up |")
    print("|---|---|---|")
    for module in order:
        print(f"| {module.removeprefix(PACKAGE)} | {entries[module]} | {back[module]} |")
    print(f"calls back up: {sum(back.values())}")
    print(f"compressor modules entered: {len(compressor)}, most entries: "
          f"{max((entries[m] for m in compressor), default=0)} ({', '.join(m for m in compressor if entries[m] == max(entries[x] for x in compressor))})")


if __name__ == "__main__":
    main()
