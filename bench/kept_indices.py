"""The kept indices of every selection path on the evaluation's tasks, recorded once and compared after a change.

Rows: each of the evaluation's 18 tasks at 4K and three at 16K (DCA past the embedded model's 8K) through the
default cascade (token and unit granularity), every strategy on three tasks, two questions of one context
(`queries`) and a document-id request answered twice (its second answer from the cached encoding). One engine
per dtype, float32 by default, one thread, the document cache on for the document rows only.

`--write` records the rows (results/bench/kept-indices.json: each row's kept indices as ranges, with the CPU
capability and the CPU they were computed on); without it the rows are computed again and compared with the record:
"same" when every kept index is; else the share of the recorded indices kept. Exit 1 when a row differs on the CPU
it was recorded on (another CPU's float32 kernels may round a boundary token the other way).

    .venv/bin/python bench/kept_indices.py [--write] [--rows 4k-default,strategies] [--tasks logs,vt] [--record PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from ilre.engine.engine import Engine, EngineConfig  # noqa: E402
from ilre.evaluation.tasks.ruler import TASKS, generate_sample  # noqa: E402

try:
    from ilre.contract.messages import CompressRequest  # noqa: E402
except ImportError:  # the tree before the contract's own package
    from ilre.engine.messages import CompressRequest  # type: ignore[no-redef]  # noqa: E402

RECORD = Path(__file__).resolve().parents[1] / "results" / "bench" / "kept-indices.json"
SEED = 9300  # the evaluation's runs use seeds from 0
BUDGET = 512
LONG_TASKS = ("niah_single_3", "niah_multikey_2", "records_jsonl")
STRATEGY_TASKS = ("niah_single_1", "niah_multikey_1", "logs")
STRATEGIES = ("ilre", "snapkv", "streaming_llm", "lagkv", "reattention", "locret", "actqkv")
GROUPS = ("4k-default", "4k-unit", "16k-default", "strategies", "queries", "documents")


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), "" where it is not known."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


def ranges(indices: list[int]) -> list[list[int]]:
    """Sorted indices as [start, end) runs."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return runs


def expand(runs: list[list[int]]) -> list[int]:
    return [i for start, end in runs for i in range(start, end)]


def requests(tokenizer: Any, groups: set[str], tasks: set[str]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """(row name, the requests answered in order; the row keeps the last answer's indices): the rows of `groups`,
    those of one task for the tasks in `tasks` only (empty: all)."""
    def sample(task: str, length: int):
        return generate_sample(tokenizer, task, length, seed=SEED)

    if "4k-default" in groups or "4k-unit" in groups:
        for task in TASKS:
            if tasks and task not in tasks:
                continue
            s = sample(task, 4096)
            base = {"context_ids": s.context_ids, "query_ids": s.query_ids, "budget": BUDGET}
            if "4k-default" in groups:
                yield f"4k-default/{task}", [base]
            if "4k-unit" in groups:
                yield f"4k-unit/{task}", [{**base, "granularity": "unit"}]
    if "16k-default" in groups:
        for task in LONG_TASKS:
            if tasks and task not in tasks:
                continue
            s = sample(task, 16384)
            yield f"16k-default/{task}", [{"context_ids": s.context_ids, "query_ids": s.query_ids, "budget": 1024}]
    if "strategies" in groups:
        for task in STRATEGY_TASKS:
            if tasks and task not in tasks:
                continue
            s = sample(task, 4096)
            for name in STRATEGIES:
                yield f"strategies/{name}/{task}", [{"context_ids": s.context_ids, "query_ids": s.query_ids,
                                                     "budget": BUDGET, "strategy": name}]
    if "queries" in groups:
        s, other = sample("niah_multikey_1", 4096), sample("niah_multikey_2", 4096)
        yield "queries/two-questions", [{"context_ids": s.context_ids, "queries_ids": [s.query_ids, other.query_ids],
                                         "budget": BUDGET}]
    if "documents" in groups:
        s = sample("records_json", 4096)
        first = {"context_ids": s.context_ids, "query_ids": s.query_ids, "budget": BUDGET}
        yield "documents/second-question", [first, {"query_ids": s.query_ids[1:], "budget": BUDGET}]


def kept(engine: Engine, calls: list[dict[str, Any]]) -> list[list[int]]:
    """The kept indices of the last call (one list per question); a call without a context asks the document
    the previous answer named."""
    results: list[Any] = []
    for fields in calls:
        if "context_ids" not in fields:
            fields = {**fields, "document_id": results[0].document_id}
        out = engine.compress(CompressRequest(**fields))
        results = list(out.results) if hasattr(out, "results") else [out]
    return [list(r.kept_indices) for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="record the rows instead of comparing with the record")
    parser.add_argument("--rows", default=",".join(GROUPS), help=f"groups of rows ({', '.join(GROUPS)})")
    parser.add_argument("--tasks", default="", help="only these tasks' rows of the groups by task (default: all)")
    parser.add_argument("--record", type=Path, default=RECORD)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    torch.set_num_threads(1)
    groups = {g.strip() for g in args.rows.split(",") if g.strip()}
    if unknown := groups - set(GROUPS):
        sys.exit(f"--rows: unknown {', '.join(sorted(unknown))} (known: {', '.join(GROUPS)})")
    capability, cpu = torch.backends.cpu.get_cpu_capability(), cpu_name()
    record = json.loads(args.record.read_text()) if args.record.exists() else {"rows": {}}
    plain = Engine(EngineConfig(dtype=args.dtype, doc_cache_mb=0))
    cached = Engine(EngineConfig(dtype=args.dtype, doc_cache_mb=256))
    rows, differ, start = {}, 0, time.perf_counter()
    print(f"kept indices, {args.dtype}, one thread, {cpu or 'a CPU'} ({capability})"
          + ("" if args.write else f", recorded on {record.get('cpu') or 'a CPU'} ({record.get('capability', '?')})"))
    tasks = {t.strip() for t in args.tasks.split(",") if t.strip()}
    for name, calls in requests(plain.tokenizer, groups, tasks):
        engine = cached if name.startswith("documents/") else plain
        got = [ranges(k) for k in kept(engine, calls)]
        rows[name] = got
        if args.write:
            print(f"  {name:<40} {sum(len(expand(g)) for g in got):>5} kept")
            continue
        want = record["rows"].get(name)
        if want is None:
            print(f"  {name:<40} not recorded")
            continue
        if want == got:
            print(f"  {name:<40} same")
            continue
        differ += 1
        shares = [len(set(expand(w)) & set(expand(g))) / max(len(expand(w)), 1) for w, g in zip(want, got)]
        print(f"  {name:<40} differs: {min(shares):.1%} of the recorded indices kept")
    print(f"{len(rows)} rows in {time.perf_counter() - start:.0f} s" + ("" if args.write else f", {differ} differ"))
    if args.write:
        record = {"capability": capability, "cpu": cpu, "dtype": args.dtype, "budget": BUDGET, "seed": SEED,
                  "rows": {**record["rows"], **rows}}
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, separators=(",", ":")) + "\n")
        print(f"recorded in {args.record}")
    elif differ and (record.get("capability"), record.get("cpu")) == (capability, cpu):
        sys.exit(1)


if __name__ == "__main__":
    main()
