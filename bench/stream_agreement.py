"""How close a question asked before deepening ends (its candidates run on from layer 8's kept stream) comes to the
first question's path (candidates from layer 1) and to the deepened path (every token at l_R), on texts the suite
does not generate the same way: passkeys in Shakespeare at five depths, and a fact planted in Python's reference text.

Per sample, one layer-8 encoding that keeps its stream; then the default cascade's selection from layer 1 and from
the stream, and the deepened form's (taken on from the same stream); and the stream path asked after another
question (a first question, from layer 1), reading the K/V of the candidates that one ran where both pick them
(compressor/candidate_rows.py): the path of a question sent at once after a different first question. Printed: the
share of the budget each keeps in common with the others, the share of its candidates read from the other
question's, and whether each keeps the needle.

    .venv/bin/python bench/stream_agreement.py [--tokens 16000] [--budget 1024]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ilre.compressor.pipeline import FreshEncodings, SelectionJob, resumed, select  # noqa: E402
from ilre.compressor.prefill import encode_context  # noqa: E402
from ilre.contract.messages import CompressRequest  # noqa: E402
from ilre.engine.engine import Engine  # noqa: E402
from ilre.evaluation.tasks.passkey import make_passkey_sample  # noqa: E402
from tests.service.haystacks import FACT, QUESTION, haystack  # noqa: E402


OTHER_QUESTION = " What is this text about, in a few words? It is about"  # asked first, from layer 1


def select_query(model, state, query_ids, budget, strategy, context_ids, units=None, stream=None):
    """The selection of one question against `state`, the context already encoded as `strategy` reads it."""
    encodings = FreshEncodings(model, context_ids, state.config, strategy, budget, encoded=state, stream=stream)
    return select(model, SelectionJob(context_ids, [query_ids], budget, strategy, units, encodings), state.config)[0]


def samples(engine: Engine, tokens: int) -> list[tuple[str, list[int], list[int], tuple[int, int]]]:
    """(name, context ids, query ids, needle span [a, b))."""
    out = []
    for depth in (0.1, 0.3, 0.5, 0.7, 0.9):
        s = make_passkey_sample(engine.tokenizer, tokens, depth, digits=6, seed=3)
        out.append((f"passkey {depth:.1f}", list(s.context_ids), list(s.query_ids), s.needle))
    text = haystack(engine.tokenizer, tokens, "pydoc")
    ids = engine.tokenizer(text).input_ids
    fact = engine.tokenizer(FACT.strip(), add_special_tokens=False).input_ids
    at = next(i for i in range(len(ids)) if ids[i:i + 3] == fact[:3])
    out.append(("pydoc fact", ids, engine.tokenizer(QUESTION, add_special_tokens=False).input_ids,
                (at, at + len(fact) - 2)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16000)
    parser.add_argument("--budget", type=int, default=1024)
    args = parser.parse_args()
    engine = Engine()
    print(f"{engine.model_name}, {engine.placement.describe()}, {args.tokens} tokens, budget {args.budget}")
    print("| sample | stream vs layer 1 | stream vs deepened | layer 1 vs deepened | after another question: vs stream "
          "| its reused candidates | vs deepened | needle: layer 1 / stream / after another / deepened |")
    print("|---|---|---|---|---|---|---|---|")
    other = engine.tokenizer(OTHER_QUESTION, add_special_tokens=False).input_ids
    for name, context, query, (a, b) in samples(engine, args.tokens):
        job = engine.prepare(CompressRequest(context_ids=context, query_ids=query, budget=args.budget))
        strategy, deep = job.strategy, job.strategy.reading().deepened()
        with torch.inference_mode():
            state = encode_context(job.model, job.context_ids, job.prefill, strategy.reading().encoded_layers(job.layer),
                                   keep_hidden=True)
            picks, reused = {}, 0
            for way, first, stream in (("layer 1", None, None), ("stream", None, state.hidden),
                                       ("after another", torch.tensor(other), state.hidden)):
                state.rows = None  # no rows from an earlier question, but `first`'s (from layer 1, as a first question)
                if first is not None:
                    select_query(job.model, state, first, args.budget, strategy, context_ids=job.context_ids,
                                 units=job.units)
                picks[way] = set(select_query(job.model, state, job.queries[0], args.budget, strategy,
                                              context_ids=job.context_ids, units=job.units, stream=stream).kept.tolist())
                reused = state.rows.reused if first is not None else reused
            deep_state = resumed(job.model, state, deep, take=False)()
            picks["deepened"] = set(select_query(job.model, deep_state, job.queries[0], args.budget, deep,
                                                 context_ids=job.context_ids, units=job.units).kept.tolist())
        share = {(x, y): len(picks[x] & picks[y]) / args.budget for x in picks for y in picks}
        needle = " / ".join("kept" if all(i in picks[w] for i in range(a, b)) else "lost" for w in picks)
        count = strategy.reading().candidate_count(args.budget)
        print(f"| {name} | {share['stream', 'layer 1']:.1%} | {share['stream', 'deepened']:.1%} | "
              f"{share['layer 1', 'deepened']:.1%} | {share['after another', 'stream']:.1%} | {reused / count:.1%} | "
              f"{share['after another', 'deepened']:.1%} | {needle} |", flush=True)

if __name__ == "__main__":
    main()
