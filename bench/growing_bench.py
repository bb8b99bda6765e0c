"""What a growing context costs, with and without taking its cached prefix on (`--resume on|off`), in one run.

Two conversations on the embedded model (float32 on this CPU, the default cascade, budget 1024):
  chat   a 32K-token document in the system message, then 20 turns, each adding a ~300-token question and
         answer; every turn's prompt is rendered by the model's chat template (as the sidecar renders it), the
         context is everything before the last user turn (the sidecar's split) and the query that turn
  agent  a 16K-token history, then 20 steps, each appending a ~1K-token tool result; the query is fixed
Each turn is compressed twice, in the same process:
  resuming  the cache holds the earlier turns, resuming and deepening on (the sidecar's defaults); between turns
            (while the engine downstream answers) the turn's document is deepened in the background, which takes
            the deepened prefix on: that time is printed apart, it is not the request's
  whole     resuming off and an empty cache each turn: the context is encoded whole (what every turn cost
            before), the cascade with its candidate pass
Printed per turn: the request's milliseconds both ways, the tokens taken on, the background deepening's, and
whether both kept the same tokens; then turns 2-20 summed, and their ratio. The two ways keep the same tokens
where they read the same encoding; a turn answered from a deepened document reads full depth (plain ILRe at l_R
with the coarse layer blended), so it is also compared with that, computed whole.

Rows go to --rows as they finish; a rerun skips the conversations already there (--fresh starts over).

    .venv/bin/python bench/growing_bench.py [--turns 20] [--kinds chat,agent]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ilre.engine.documents import DocumentCache  # noqa: E402
from ilre.engine.engine import Engine, EngineConfig  # noqa: E402
from ilre.engine.messages import CompressRequest  # noqa: E402
from ilre.evaluation.tasks.haystack import shakespeare_text  # noqa: E402

ROWS = Path(__file__).resolve().parents[1] / "results" / "bench" / "growing.jsonl"
BUDGET = 1024


def words(engine: Engine, start: int, tokens: int) -> str:
    """About `tokens` tokens of Shakespeare from character `start` on (wrapping around)."""
    text = shakespeare_text()
    chars = tokens * 4
    start %= max(1, len(text) - chars)
    piece = text[start: start + chars]
    return engine.tokenizer.decode(engine.tokenizer(piece).input_ids[:tokens])


def chat_turns(engine: Engine, turns: int) -> list[tuple[list[int], str]]:
    """(context IDs, query) per turn: the rendered chat before the last user turn, and that turn's question."""
    messages = [{"role": "system", "content": "Answer from this document.\n\n" + words(engine, 0, 32000)}]
    out = []
    for turn in range(turns):
        question = f"Question {turn + 1}: what does the speaker say about {words(engine, 900_000 + turn * 997, 8)}?"
        rendered = engine.tokenizer.apply_chat_template(messages, tokenize=False)
        out.append((engine.tokenizer(rendered).input_ids, question))
        messages += [{"role": "user", "content": question + " " + words(engine, 500_000 + turn * 2000, 130)},
                     {"role": "assistant", "content": words(engine, 700_000 + turn * 2000, 150)}]
    return out


def agent_steps(engine: Engine, turns: int) -> list[tuple[list[int], str]]:
    history = engine.tokenizer(words(engine, 0, 16000)).input_ids
    out = []
    for step in range(turns):
        out.append((list(history), "Which tool result names the crown?"))
        history += engine.tokenizer(f"\n<tool_result step={step + 1}>\n" + words(engine, 300_000 + step * 5000, 1000)
                                    + "\n</tool_result>\n").input_ids
    return out


def compress(engine: Engine, cache: DocumentCache, resume: bool, ids: list[int], query: str,
             **options) -> tuple[float, dict]:
    engine.documents, engine.encodings.resume, engine.deepening.enabled = cache, resume, resume
    clock = time.perf_counter()
    result = engine.compress(CompressRequest(context_ids=ids, query=query, budget=BUDGET, **options)).to_dict()
    return (time.perf_counter() - clock) * 1000.0, result


def full_depth(engine: Engine, ids: list[int], query: str) -> dict:
    """What a deepened document answers, computed whole: plain ILRe at l_R with the coarse layer blended."""
    options = engine.profile.strategy_options("cascade")
    blended = {"also_layers": [options["coarse_layer"]], "also_weight": options.get("coarse_weight", 0.5)}
    return compress(engine, DocumentCache(0), False, ids, query, strategy="ilre", strategy_options=blended)[1]


def run(engine: Engine, kind: str, turns: int) -> dict:
    conversation = (chat_turns if kind == "chat" else agent_steps)(engine, turns)
    resuming, whole = DocumentCache(4 << 30), DocumentCache(4 << 30)
    rows = []
    for turn, (ids, query) in enumerate(conversation, 1):
        on_ms, on = compress(engine, resuming, True, ids, query)
        clock = time.perf_counter()
        engine.deepening.wait_idle(3600)  # the background deepening, while the engine downstream answers
        deepen_ms = (time.perf_counter() - clock) * 1000.0
        whole.clear()  # nothing of the earlier turns: the context is encoded whole, as before resuming existed
        off_ms, off = compress(engine, whole, False, ids, query)
        deep = on["strategy"] == "cascade" and on["kept_indices"] != off["kept_indices"]
        same = on["kept_indices"] == (full_depth(engine, ids, query)["kept_indices"] if deep else off["kept_indices"])
        rows.append({"turn": turn, "tokens": len(ids), "resume_ms": round(on_ms, 1), "whole_ms": round(off_ms, 1),
                     "deepen_ms": round(deepen_ms, 1), "resumed_tokens": on["resumed_tokens"], "same_kept": same,
                     "read": "full depth" if deep else "the same encoding"})
        print(f"{kind:5} turn {turn:2}  {len(ids):6} tokens  resumed {on['resumed_tokens']:6}  "
              f"{on_ms:9.1f} ms  whole {off_ms:9.1f} ms  (deepening after it {deepen_ms:8.1f} ms)  "
              f"same kept as {'full depth' if deep else 'whole'}: {same}", flush=True)
    later_on = sum(r["resume_ms"] for r in rows[1:])
    later_off = sum(r["whole_ms"] for r in rows[1:])
    summary = {"kind": kind, "turns": turns, "later_resume_ms": round(later_on, 1), "later_whole_ms": round(later_off, 1),
               "ratio": round(later_on / later_off, 3), "all_same_kept": all(r["same_kept"] for r in rows), "rows": rows}
    print(f"{kind}: turns 2-{turns} {later_on / 1000:.1f} s resuming vs {later_off / 1000:.1f} s whole "
          f"({summary['ratio']:.3f}x); every turn kept the same: {summary['all_same_kept']}", flush=True)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--kinds", default="chat,agent")
    parser.add_argument("--rows", type=Path, default=ROWS)
    parser.add_argument("--fresh", action="store_true")
    args = parser.parse_args()
    if args.fresh and args.rows.exists():
        args.rows.unlink()
    done = {json.loads(line)["kind"] for line in args.rows.open()} if args.rows.exists() else set()
    engine = Engine(EngineConfig(dtype="float32"))
    print(f"{engine.model_name}, layer {engine.layer}, float32, budget {BUDGET}", flush=True)
    for kind in args.kinds.split(","):
        if kind in done:
            print(f"{kind}: already in {args.rows}")
            continue
        summary = run(engine, kind, args.turns)
        args.rows.parent.mkdir(parents=True, exist_ok=True)
        with args.rows.open("a") as out:
            out.write(json.dumps(summary) + "\n")


if __name__ == "__main__":
    main()
