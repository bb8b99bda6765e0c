"""Lossless on demand: with retrieve rounds on, a compressed message opens with a note naming its hash,
the sidecar offers the model a tool (`ilre_retrieve`: a hash and a question), and when the model calls
it the sidecar answers the call itself, from the document cache (the message's original, compressed for
the question), and asks the engine again. The client sees neither the tool nor its calls: its own
tools and calls pass through, and it gets the engine's last answer in the API's own shape.

Rounds are bounded: after `rounds` rounds of calls the tool is withdrawn (and a tool_choice naming it
dropped), so the engine's next answer is the last. The engine is asked without streaming; a client that
asked for a stream gets the last answer as the API's events (tool_dialects.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Mapping

from ...contract.document_ids import HASH_CHARS, is_hex
from ..common.errors import Code, ServiceError
from ..common.keys import KeyPolicy
from ..transport.frontend import Frontend
from .tool_dialects import Dialect, TOOL_NAME, ToolCall

MARKER = ("[ilre kept {kept} of {original} tokens of this message for the current question. To read more of it, "
          "call " + TOOL_NAME + " with hash \"{hash}\" and what you need.]\n")
RETRIEVE_BUDGET = 1024  # tokens of the original an answered call returns
STREAM_FIELDS = ("stream", "stream_options")  # asked of the engine without them; answered as events when "stream"


@dataclass
class Rounds:
    """What the retrieve loop needs of one request: the API's dialect, the body to send (tool offered),
    whether the client asked for a stream, and the live question (for calls that name none)."""

    dialect: Dialect
    body: dict[str, Any]
    stream: bool
    question: str
    rounds: int
    calls: int = 0  # retrieve calls answered so far


def prepare(dialect: Dialect, body: dict[str, Any], hashes: list[str], question: str | None, rounds: int) -> Rounds:
    """The loop's state for a compressed `body` whose compressed messages (of `hashes`) carry MARKER."""
    sent = {k: v for k, v in body.items() if k not in STREAM_FIELDS}
    return Rounds(dialect, dialect.offer(sent, hashes), bool(body.get("stream")), question or "", rounds)


async def answer_call(frontend: Frontend, call: ToolCall, question: str, caller: KeyPolicy, rid: str,
                      deadline: float) -> tuple[str, str]:
    """(the tool result's text, the outcome: found | not_found | failed) for one call of the tool."""
    if len(call.hash) != HASH_CHARS or not is_hex(call.hash):
        return f"No shortened message has the hash {call.hash[:40]!r}: give the {HASH_CHARS}-digit hash its note names.", "not_found"
    fields = {"document_id": call.hash, "query": call.question.strip() or question or ".", "budget": RETRIEVE_BUDGET,
              "granularity": "unit"}
    try:
        outcome = await frontend.compress(fields, max(deadline - time.monotonic(), 0.0), "sidecar.retrieve", many=False,
                                          caller=caller, rid=rid)
    except ServiceError as exc:
        if exc.code is Code.NOT_FOUND:
            return f"The original of {call.hash} is no longer held; answer from what the conversation shows.", "not_found"
        return f"Reading {call.hash} failed ({exc.message}); answer from what the conversation shows.", "failed"
    return outcome.results[0].compressed_context, "found"


async def next_body(state: Rounds, answer: dict[str, Any], frontend: Frontend, caller: KeyPolicy, rid: str,
                    deadline: float, counted: Any) -> dict[str, Any] | None:
    """The body of the next round when `answer` calls the retrieve tool (and the client's tools not),
    with each call answered; None when `answer` is the last one. `counted(outcome)` counts each call."""
    calls, theirs = state.dialect.calls(answer)
    if not calls or theirs:
        return None
    results = await asyncio.gather(*(answer_call(frontend, c, state.question, caller, rid, deadline) for c in calls))
    for _, outcome in results:
        counted(outcome)
    state.calls += len(calls)
    return state.dialect.answer_calls(state.body, answer, [(c, text) for c, (text, _) in zip(calls, results)])


def encode(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode()
