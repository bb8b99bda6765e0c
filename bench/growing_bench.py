"""What a growing context costs, with and without taking its cached prefix on (`--resume on|off`), in one run.

Two conversations on the embedded model (`--dtype`, default auto: float32 on a CPU without native bfloat16; the
default cascade, budget 1024):
  chat   through the sidecar (in this process, in front of llama.cpp's llama-server serving the same model): a
         32K-token document in the system message, then 20 turns, each adding a ~300-token question and answer;
         each turn is one POST /v1/chat/completions (one new token); the sidecar reads the chat message by
         message and compresses the document and the earlier questions for the last one, each to its share
  agent  in process: a 16K-token history, then 20 steps, each appending a ~1K-token tool result; the query is fixed
  agent-at-once  the same steps sent back to back, as an agent sends its next step seconds after a tool returns:
         deepening never runs, each step takes the step before on and starts its candidates from the stream it
         kept, those the step before ran read from its rows (then every step encoded whole, for the baseline and
         for the path a resumed step approximates: the share of its kept tokens in common with it is printed)
Each turn of chat and agent is sent twice, in the same process:
  resuming  the cache holds the earlier turns, resuming and deepening on (the sidecar's defaults); between turns
            (while the engine downstream answers) the turn's document is deepened in the background, which takes
            the deepened prefix on: that time is printed apart, it is not the request's
  whole     resuming and deepening off and an empty cache each turn: the context is encoded whole (what every
            turn cost before), the cascade with its candidate pass
Printed per turn: the compression's milliseconds both ways (through the sidecar: its x-ilre-compress-ms), the
tokens taken on, the background deepening's, and whether both sent on the same tokens (through the sidecar: the
bytes llama-server received, read by a recording relay). The two ways send the same tokens where they read the
same encoding; a turn answered from a deepened document reads full depth (plain ILRe at l_R with the coarse layer
blended), so it is compared with that, computed whole (in process; through the sidecar, where a message's share
of the budget is not the context's, a turn read at full depth is not compared). Then turns 2-20 summed, and
their ratio.

Rows go to --rows as each turn finishes; a rerun goes on from the turn after the last one there (it first sends
that turn again, untimed, to hold what the earlier turns left in the cache); --fresh starts over.

    .venv/bin/python bench/growing_bench.py [--turns 20] [--kinds chat,agent] [--dtype auto]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ilre.contract.messages import CompressRequest  # noqa: E402
from ilre.engine.documents import DocumentCache  # noqa: E402
from ilre.engine.engine import Engine, EngineConfig  # noqa: E402
from ilre.evaluation.tasks.haystack import shakespeare_text  # noqa: E402
from ilre.service.common.config import ServiceConfig, SidecarConfig  # noqa: E402
from ilre.service.server import ServiceThread  # noqa: E402
from tests.service.engines import LlamaServer, RecordingRelay  # noqa: E402

ROWS = Path(__file__).resolve().parents[1] / "results" / "bench" / "growing.jsonl"
BUDGET = 1024
Turn = tuple[list[int], list[int], object]  # context IDs, query IDs, what is sent (messages or the IDs)
Send = Callable[[object], tuple[float, list[int], int]]  # -> (compression ms, tokens sent on, tokens resumed)


def words(engine: Engine, start: int, tokens: int) -> str:
    """About `tokens` tokens of Shakespeare from character `start` on (wrapping around)."""
    text = shakespeare_text()
    chars = tokens * 4
    start %= max(1, len(text) - chars)
    piece = text[start: start + chars]
    return engine.tokenizer.decode(engine.tokenizer(piece).input_ids[:tokens])


def chat_turns(engine: Engine, turns: int, document: int = 32000) -> list[Turn]:
    """Per turn: the document's tokens, the last user turn's (the query), and the messages sent."""
    messages = [{"role": "system", "content": "Answer from this document.\n\n" + words(engine, 0, document)}]
    out = []
    for turn in range(turns):
        question = (f"Question {turn + 1}: what does the speaker say about {words(engine, 900_000 + turn * 997, 8)}? "
                    + words(engine, 500_000 + turn * 2000, 130))
        sent = messages + [{"role": "user", "content": question}]
        out.append((engine.tokenizer(messages[0]["content"]).input_ids, engine.tokenizer(question).input_ids, sent))
        messages = sent + [{"role": "assistant", "content": words(engine, 700_000 + turn * 2000, 150)}]
    return out


def agent_steps(engine: Engine, turns: int, document: int = 16000) -> list[Turn]:
    history = engine.tokenizer(words(engine, 0, document)).input_ids
    query = engine.tokenizer("Which tool result names the crown?", add_special_tokens=False).input_ids
    out = []
    for step in range(turns):
        out.append((list(history), query, list(history)))
        history += engine.tokenizer(f"\n<tool_result step={step + 1}>\n" + words(engine, 300_000 + step * 5000, 1000)
                                    + "\n</tool_result>\n").input_ids
    return out


def set_way(engine: Engine, cache: DocumentCache, resume: bool) -> None:
    """Resuming (and deepening) on or off, reading `cache`."""
    engine.documents, engine.encodings.resume, engine.deepening.enabled = cache, resume, resume


def in_process(engine: Engine, query: list[int]) -> Send:
    def send(ids: object) -> tuple[float, list[int], int]:
        clock = time.perf_counter()
        result = engine.compress(CompressRequest(context_ids=ids, query_ids=query, budget=BUDGET))
        return (time.perf_counter() - clock) * 1000.0, result.token_ids, result.resumed_tokens
    return send


class ThroughSidecar:
    """The sidecar (a ServiceThread over `engine`) in front of llama-server, a recording relay between them."""

    def __init__(self, engine: Engine):
        self.server = LlamaServer(4096, 2)
        self.relay = RecordingRelay(self.server.port)
        sidecar = SidecarConfig(engine_url=self.relay.url, engine_api="llamacpp", engine_timeout_s=3600)
        self.service = ServiceThread(ServiceConfig(host="127.0.0.1", grpc_port=0, http_port=0), engine,
                                     sidecar=sidecar, tokenizer=engine.tokenizer).__enter__()
        self.url = f"http://127.0.0.1:{self.service.http_port}"
        self.send(self.chat([{"role": "user", "content": "Hello."}]))  # the forwarding mode is probed once

    @staticmethod
    def chat(messages: list[dict]) -> dict:
        return {"model": "smollm2", "messages": messages, "max_tokens": 1, "temperature": 0}

    def resumed_total(self) -> float:
        """The service's ilre_tokens_resumed_total (its /metrics; the sidecar's own port relays the engine's)."""
        return self.service.service.metrics.tokens_resumed._value.get()

    def send(self, body: dict) -> httpx.Response:
        reply = httpx.post(self.url + "/v1/chat/completions", json=body, headers={"x-ilre-budget": str(BUDGET)},
                           timeout=3600)
        if reply.status_code != 200:
            raise SystemExit(f"sidecar: {reply.status_code} {reply.text[:300]}")
        return reply

    def __call__(self, messages: object) -> tuple[float, list[int], int]:
        before = self.resumed_total()
        reply = self.send(self.chat(messages))
        if reply.headers.get("x-ilre-action") != "compressed":
            raise SystemExit(f"sidecar did not compress: {dict(reply.headers)}")
        sent_on = [m["content"] for m in self.relay.last("/v1/chat/completions").json()["messages"]]
        return float(reply.headers["x-ilre-compress-ms"]), sent_on, int(self.resumed_total() - before)

    def close(self) -> None:
        self.service.__exit__(None, None, None)
        self.server.stop()


def full_depth_options(profile) -> dict:
    """A deepened cascade document's scoring as plain ILRe's request options: l_R's attention with the
    profile's coarse layer beside it at its weight (tests/reference.py holds the tests' own copy)."""
    options = profile.strategy_options("cascade")
    return {"also_layers": [options["coarse_layer"]], "also_weight": options.get("coarse_weight", 0.5)}


def full_depth(engine: Engine, context: list[int], query: list[int]) -> list[int]:
    """What a deepened document sends on, computed whole: plain ILRe at l_R with the coarse layer blended."""
    blended = full_depth_options(engine.profile)
    set_way(engine, DocumentCache(0), False)
    return engine.compress(CompressRequest(context_ids=context, query_ids=query, budget=BUDGET, strategy="ilre",
                                           strategy_options=blended)).token_ids


def one_turn(engine: Engine, send: Send, resuming: DocumentCache, whole: DocumentCache, turn: Turn) -> dict:
    context, query, sent = turn
    set_way(engine, resuming, True)
    on_ms, on_ids, resumed = send(sent)
    clock = time.perf_counter()
    engine.deepening.wait_idle(3600)  # the background deepening, while the engine downstream answers
    deepen_ms = (time.perf_counter() - clock) * 1000.0
    whole.clear()  # nothing of the earlier turns: the context is encoded whole, as before resuming existed
    set_way(engine, whole, False)
    off_ms, off_ids, _ = send(sent)
    deep = on_ids != off_ids
    if not deep:
        same: bool | None = True
    else:  # a message's share of the budget is not the context's: only a context compressed whole compares
        same = None if isinstance(send, ThroughSidecar) else on_ids == full_depth(engine, context, query)
    return {"tokens": len(context), "resume_ms": round(on_ms, 1), "whole_ms": round(off_ms, 1),
            "deepen_ms": round(deepen_ms, 1), "resumed_tokens": resumed, "same_sent": same,
            "read": "full depth" if deep else "the same encoding"}


def run(engine: Engine, kind: str, turns: int, rows: Path, document: int | None) -> None:
    done = [r for r in read_rows(rows) if r["kind"] == kind and "turn" in r]
    if any(r["kind"] == kind and "ratio" in r for r in read_rows(rows)):
        print(f"{kind}: already in {rows}")
        return
    make = chat_turns if kind == "chat" else agent_steps
    conversation = make(engine, turns) if document is None else make(engine, turns, document)
    sidecar = ThroughSidecar(engine) if kind == "chat" else None
    send = sidecar or in_process(engine, conversation[0][1])
    resuming, whole = DocumentCache(4 << 30), DocumentCache(4 << 30)
    try:
        if done:  # hold what the earlier turns left: the last one sent again, untimed
            set_way(engine, resuming, True)
            send(conversation[len(done) - 1][2])
            engine.deepening.wait_idle(3600)
        for number in range(len(done) + 1, turns + 1):
            row = {"kind": kind, "turn": number, **one_turn(engine, send, resuming, whole, conversation[number - 1])}
            append(rows, row)
            print(f"{kind:5} turn {number:2}  {row['tokens']:6} tokens  resumed {row['resumed_tokens']:6}  "
                  f"{row['resume_ms']:9.1f} ms  whole {row['whole_ms']:9.1f} ms  (deepening after it "
                  f"{row['deepen_ms']:8.1f} ms)  same sent as {'full depth' if row['read'] == 'full depth' else 'whole'}: "
                  f"{row['same_sent']}", flush=True)
    finally:
        if sidecar is not None:
            sidecar.close()
    summarize(kind, turns, [r for r in read_rows(rows) if r["kind"] == kind and "turn" in r], rows)


def run_at_once(engine: Engine, turns: int, rows: Path, document: int | None) -> None:
    """The agent's steps sent back to back (no wait: deepening never gets its turn), resuming on, then each step
    encoded whole for the baseline. A resumed step takes on the kept encoding of the step before and starts its
    candidates from the stream it kept, reading the K/V of the candidates the step before ran where it picks them
    too (compressor/candidate_rows.py: an approximation); the path it stands for without them is that computed whole
    (the whole context encoded with its stream, the candidates started there: compressor/candidate_prefill.Streams),
    and the step's kept tokens are compared with it: the share in common (a step encoded from the start: equal)."""
    kind = "agent-at-once"
    done = [r for r in read_rows(rows) if r["kind"] == kind and "turn" in r]
    if any(r["kind"] == kind and "ratio" in r for r in read_rows(rows)):
        print(f"{kind}: already in {rows}")
        return
    steps = agent_steps(engine, turns) if document is None else agent_steps(engine, turns, document)
    send = in_process(engine, steps[0][1])
    set_way(engine, DocumentCache(4 << 30), True)
    resumed = []
    for _, _, ids in steps:  # every step again (a rerun too): the cache must hold the steps before
        resumed.append(send(ids))
        print(f"{kind} step {len(resumed):2} resumed {resumed[-1][2]:6} tokens in {resumed[-1][0]:9.1f} ms", flush=True)
    set_way(engine, DocumentCache(0), False)
    for number in range(len(done) + 1, turns + 1):
        context, query, ids = steps[number - 1]
        on_ms, on_ids, taken = resumed[number - 1]
        off_ms, off_ids, _ = send(ids)
        want = off_ids if taken == 0 else from_stream(engine, context, query)
        common = sum((Counter(on_ids) & Counter(want)).values()) / len(want)
        row = {"kind": kind, "turn": number, "tokens": len(context), "resume_ms": round(on_ms, 1),
               "whole_ms": round(off_ms, 1), "resumed_tokens": taken, "same_sent": on_ids == want if taken == 0 else None,
               "in_common": round(common, 4), "read": "the same encoding" if taken == 0 else "from the kept stream"}
        append(rows, row)
        print(f"{kind} step {number:2}  {row['tokens']:6} tokens  resumed {taken:6}  {row['resume_ms']:9.1f} ms  "
              f"whole {row['whole_ms']:9.1f} ms  in common with its path computed whole (no rows): {common:.1%}",
              flush=True)
    summarize(kind, turns, [r for r in read_rows(rows) if r["kind"] == kind and "turn" in r], rows)


def from_stream(engine: Engine, context: list[int], query: list[int]) -> list[int]:
    """The step's kept tokens as a resumed step computes them, the whole context encoded at once: the default strategy
    on an encoding that kept its stream, its candidates started there."""
    import torch

    from ilre.compressor.pipeline import FreshEncodings, SelectionJob, select
    from ilre.compressor.prefill import encode_context

    job = engine.prepare(CompressRequest(context_ids=context, query_ids=query, budget=BUDGET))
    with torch.inference_mode():
        state = encode_context(job.model, job.context_ids, job.prefill, job.strategy.reading().encoded_layers(job.layer),
                               keep_hidden=True)
        encodings = FreshEncodings(job.model, job.context_ids, job.prefill, job.strategy, BUDGET, encoded=state,
                                   stream=state.hidden)
        kept = select(job.model, SelectionJob(job.context_ids, job.queries[:1], BUDGET, job.strategy, job.units,
                                              encodings), job.prefill)[0].kept
    return [context[i] for i in kept.tolist()] + list(query)  # as the engine's token_ids: the kept, then the query


def summarize(kind: str, turns: int, done: list[dict], rows: Path) -> None:
    later_on = sum(r["resume_ms"] for r in done[1:])
    later_off = sum(r["whole_ms"] for r in done[1:])
    summary = {"kind": kind, "turns": turns, "later_resume_ms": round(later_on, 1), "later_whole_ms": round(later_off, 1),
               "ratio": round(later_on / later_off, 3), "all_same_sent": all(r["same_sent"] is not False for r in done)}
    shares = [r["in_common"] for r in done if r.get("same_sent") is None and "in_common" in r]
    if shares:
        summary["in_common"] = [min(shares), round(sum(shares) / len(shares), 4)]
    append(rows, summary)
    print(f"{kind}: turns 2-{turns} {later_on / 1000:.1f} s resuming vs {later_off / 1000:.1f} s whole "
          f"({summary['ratio']:.3f}x); every turn compared exactly sent the same: {summary['all_same_sent']}"
          + (f"; taken-on steps in common with their path without rows: {min(shares):.1%} at least, "
             f"{sum(shares) / len(shares):.1%} on average" if shares else ""), flush=True)


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def append(path: Path, row: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps(row) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--kinds", default="chat,agent,agent-at-once")
    parser.add_argument("--rows", type=Path, default=ROWS)
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--document-tokens", type=int, help="a shorter start (a quick look): chat 32000, agent 16000")
    parser.add_argument("--dtype", default="auto", help="the engine's --dtype (auto: as `ilre serve` picks it)")
    args = parser.parse_args()
    if args.fresh and args.rows.exists():
        args.rows.unlink()
    engine = Engine(EngineConfig(dtype=args.dtype))
    print(f"{engine.model_name}, layer {engine.layer}, {engine.placement.describe()}, budget {BUDGET}", flush=True)
    for kind in args.kinds.split(","):
        if kind == "agent-at-once":
            run_at_once(engine, args.turns, args.rows, args.document_tokens)
        else:
            run(engine, kind, args.turns, args.rows, args.document_tokens)


if __name__ == "__main__":
    main()
