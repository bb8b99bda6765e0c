"""Every strategy's selections on fixed samples, as JSON: run before and after a change that must not
change behaviour, and compare (bit for bit in float32 on one machine).

    python -m tests.selection_snapshot --output before.json
    ... change ...
    python -m tests.selection_snapshot --output after.json --compare before.json

Samples: Shakespeare haystacks with a planted fact (tests/service/haystacks.py) at one chunk and at
several, DCA off and on, token and unit granularity, a multi-query request, a document asked again by
id, a batch through `compress_many` with batching on, and every strategy with its default options
(Locret where a retaining head is stored).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

STRATEGIES = ("cascade", "ilre", "snapkv", "streaming_llm", "lagkv", "reattention", "locret", "actqkv")
QUERIES = ("\n\nQuestion: What is the vault code of the Duke of Milan's museum?\nAnswer: The vault code is",
           "\n\nQuestion: Who speaks first in the scene?\nAnswer:")


def _result(outcome) -> object:
    from ilre.contract.messages import CompressResults

    if isinstance(outcome, Exception):
        return f"{type(outcome).__name__}: {outcome}"
    results = outcome.results if isinstance(outcome, CompressResults) else [outcome]
    keep = ("kept_indices", "token_ids", "compressed_context", "budget", "layer", "strategy", "dca", "passthrough",
            "granularity", "kept_spans")
    return [{k: getattr(r, k) for k in keep} for r in results]


def snapshot() -> dict[str, object]:
    import torch

    from ilre.engine.engine import Engine, EngineConfig
    from ilre.contract.messages import CompressRequest
    from tests.service.haystacks import haystack

    torch.manual_seed(0)
    engine = Engine(EngineConfig(dtype="float32"))
    texts = {"1chunk": haystack(engine.tokenizer, 900), "4K": haystack(engine.tokenizer, 4200)}
    out: dict[str, object] = {}
    for name, text in texts.items():
        for strategy in STRATEGIES:
            for granularity in ("token", "unit"):
                for dca in ("off", "on"):
                    for budget in (64, 300):
                        key = f"{name}/{strategy}/{granularity}/dca-{dca}/b{budget}"
                        request = CompressRequest(context=text, query=QUERIES[0], budget=budget, strategy=strategy,
                                                  granularity=granularity, dca=dca)
                        try:
                            out[key] = _result(engine.compress(request))
                        except Exception as exc:  # noqa: BLE001 - a refusal is part of the behaviour
                            out[key] = _result(exc)
        out[f"{name}/default/queries"] = _result(engine.compress(CompressRequest(context=text, queries=list(QUERIES),
                                                                                 budget=200)))
        first = engine.compress(CompressRequest(context=text, query=QUERIES[1], budget=150))
        out[f"{name}/default/by-id"] = _result(engine.compress(CompressRequest(document_id=first.document_id,
                                                                               query=QUERIES[0], budget=150)))
    batched = Engine(EngineConfig(dtype="float32", batch_tokens=16384))
    requests = [CompressRequest(context=texts["1chunk"][: 1200 + 300 * i], query=QUERIES[i % 2], budget=budget,
                                strategy=strategy)
                for i, (strategy, budget) in enumerate([(s, b) for s in ("cascade", "ilre") for b in (64, 200, 400)])]
    out["batch"] = [_result(o) for o in batched.compress_many(requests)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True)
    parser.add_argument("--compare", help="an earlier snapshot: exit 1 naming every sample that differs")
    args = parser.parse_args()
    data = snapshot()
    Path(args.output).write_text(json.dumps(data, indent=0, sort_keys=True))
    print(f"{len(data)} samples -> {args.output}")
    if args.compare:
        before = json.loads(Path(args.compare).read_text())
        differ = sorted(k for k in set(before) | set(data) if before.get(k) != json.loads(json.dumps(data.get(k))))
        print(f"{len(differ)} differ" + "".join(f"\n  {k}" for k in differ))
        sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
