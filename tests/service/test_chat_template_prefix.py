"""Which well-known chat templates are prefix-stable: what an engine's prefix cache (vLLM's prefix caching,
SGLang's radix cache, llama.cpp's slot reuse) can keep of one request for the next when the messages
before the live question are sent the same bytes again (the sidecar's history mode frozen).

The cache holds for a growing conversation only when the previous request's rendered prompt before its
question (its last user turn; in a long last turn, documents followed by their question, its last
QUERY_TOKENS tokens) is a character prefix of the next request's rendered prompt. Each real template in chat_templates/ (SOURCES.md says where it came from)
is rendered through the embedded model's tokenizer for two growing conversations, and the outcome must
match EXPECTED, so a template whose behaviour is misclassified fails here:

- chat: a system message holding a long document, then user question / assistant answer turns; the
  answers carry a <think> block, as clients of reasoning models send them back.
- agent: a short system message, one user task, assistant tool calls (with <think> blocks) answered by
  long tool results, a final answer, then a new user message.
- dated: the rendering holds today's date (strftime_now), so a chat that goes on past midnight loses its
  prefix whatever the turns; checked by rendering the same messages on two different days.

The documents are longer than LONG_TURN_TOKENS: a long last turn then joins the context (all but its
last query tokens), so whatever a template renders inside the last user turn (or after it) becomes part
of the context.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import pytest
from transformers import AutoTokenizer
from transformers.utils import chat_template_utils

from ilre.contract.chat import last_user_index
from ilre.models.embedded import embedded_checkpoint

TEMPLATES = Path(__file__).parent / "chat_templates"
QUERY_TOKENS = 128
LONG_TURN_TOKENS = 1024  # a last user turn longer than this holds documents before its question
Message = dict[str, Any]


@dataclass(frozen=True)
class Expected:
    chat: bool          # a growing user/assistant chat keeps its context as a prefix
    agent: bool | None  # a tool-calling loop then a new user turn does; None: the template cannot render it
    dated: bool         # the rendering changes with the date (a chat spanning midnight is not prefix-stable)
    system: bool = True  # takes a system message (else the chat's document opens the first user turn)


EXPECTED: dict[str, Expected] = {
    "smollm2": Expected(chat=True, agent=True, dated=False),
    "vllm_chatml": Expected(chat=True, agent=True, dated=False),
    "qwen2_5": Expected(chat=True, agent=True, dated=False),
    "llama3_1": Expected(chat=True, agent=True, dated=False),  # prints a fixed "Today Date: 26 Jul 2024"
    "llama3_2": Expected(chat=True, agent=True, dated=True),   # "Today Date: " + strftime_now("%d %b %Y")
    # Gemma 2 raises on a system message (the document goes into the first user turn) and on tool turns
    # (roles must alternate user/model).
    "gemma2": Expected(chat=True, agent=None, dated=False, system=False),
    "phi3_5": Expected(chat=True, agent=True, dated=False),  # drops tool turns and tool calls silently
    # Mistral v0.3 / Nemo style: the system prompt is printed inside the last user turn ("[INST]" + system +
    # "\n\n" + question). A long system document sits in the last turn, joins the context there, and moves
    # to the new last user turn on the next request: the earlier context is no longer a prefix. (Only when
    # the user turn is the last message at all: requests ending with a tool result lose the system prompt,
    # so the tool loop happens to stay stable.)
    "mistral_nemo": Expected(chat=False, agent=True, dated=False),
    # Mistral Small 3.x puts the system prompt first ([SYSTEM_PROMPT]); its strftime_now date only goes
    # into the default system prompt, which a given system message replaces.
    "mistral_small_3_2": Expected(chat=True, agent=True, dated=False),
    # Qwen3 prints an assistant turn's <think> block only after the last user message: in a plain chat
    # every answer precedes the last user message and is stripped in every request alike (stable), but in
    # a tool loop the reasoning of the turns after the user's task is printed (and, with long tool results,
    # part of the context) until the next user message strips it.
    "qwen3": Expected(chat=True, agent=False, dated=False),
    # QwQ, DeepSeek-R1 (distill) and V3.1 strip "...</think>" from assistant answers wherever they stand
    # (QwQ: all but a final message; tool-call turns keep their content): the same text in every request.
    "qwq": Expected(chat=True, agent=True, dated=False),
    "deepseek_r1_distill_qwen": Expected(chat=True, agent=True, dated=False),
    "deepseek_v3_1": Expected(chat=True, agent=True, dated=False),
    "granite3_3": Expected(chat=True, agent=True, dated=False),  # date only in the default system prompt
    "command_r7b": Expected(chat=True, agent=True, dated=False),
    # gpt-oss: prints a tool-calling assistant turn's content as an analysis (reasoning) message only while
    # no final assistant answer follows it: the final answer drops the earlier tool calls' analysis. And
    # "Current date: " + strftime_now(...) in its built-in system message.
    "gpt_oss": Expected(chat=True, agent=False, dated=True),
}

DOCUMENT = "".join(f"Line {i}: the value of item {i} is {7 * i + 3}.\n" for i in range(1, 81))  # ~1.5k tokens
NOTES = "".join(f"Note {i}: box {i} holds {3 * i + 1} screws.\n" for i in range(1, 81))


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(embedded_checkpoint()))


def template(family: str) -> str:
    return (TEMPLATES / f"{family}.jinja").read_text()


def answer(i: int) -> str:
    return f"<think>\nItem {7 * i} is on line {7 * i}.\n</think>\n\nThe value of item {7 * i} is {49 * i + 3}."


def chat_requests(system: bool, turns: int = 4) -> list[list[Message]]:
    """Request k (k = 1..turns): the system document, k-1 question/answer pairs, question k."""
    instructions = "Answer from this document.\n\n" + DOCUMENT
    messages: list[Message] = [{"role": "system", "content": instructions}] if system else []
    requests = []
    for i in range(1, turns + 1):
        question = f"Question {i}: what is the value of item {7 * i}?"
        if i == 1 and not system:
            question = instructions + "\n" + question
        messages = messages + [{"role": "user", "content": question}]
        requests.append(messages)
        messages = messages + [{"role": "assistant", "content": answer(i)}]
    return requests


def tool_call(n: int, path: str) -> Message:
    call = {"id": f"call{n:05d}", "type": "function",  # 9 characters, as Mistral's templates demand
            "function": {"name": "read_file", "arguments": json.dumps({"path": path})}}
    return {"role": "assistant", "content": f"<think>\nI should read {path}.\n</think>\n\n", "tool_calls": [call]}


def tool_result(n: int, content: str) -> Message:
    return {"role": "tool", "tool_call_id": f"call{n:05d}", "name": "read_file", "content": content}


def agent_requests(system: bool) -> list[list[Message]]:
    """Task, tool call, long result | another tool call, long result | final answer, new user message."""
    instructions, task = "You are an agent that reads files to answer.", "What do notes.txt and items.txt say?"
    opening: list[Message] = ([{"role": "system", "content": instructions}, {"role": "user", "content": task}]
                              if system else [{"role": "user", "content": instructions + "\n" + task}])
    first = opening + [tool_call(1, "notes.txt"), tool_result(1, NOTES)]
    second = first + [tool_call(2, "items.txt"), tool_result(2, DOCUMENT)]
    final = {"role": "assistant", "content": "<think>\nBoth files are read.\n</think>\n\nBoxes and items."}
    third = second + [final, {"role": "user", "content": "Which box holds the most screws?"}]
    return [first, second, third]


def frozen_clock(day: dt.date) -> type[dt.datetime]:
    """A datetime whose now() is noon of `day` (transformers' strftime_now reads datetime.now())."""

    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> dt.datetime:
            return dt.datetime.combine(day, dt.time(12), tz)

    return Frozen


def before_question(tokenizer, family: str, messages: list[Message]) -> tuple[str, str]:
    """(the rendered prompt, its text before the question): before the last user turn, which starts where
    the turns before it render to (or just after the previous message's content; where the template moves
    a content, at the turn's own); in a last turn longer than LONG_TURN_TOKENS, before its last
    QUERY_TOKENS tokens."""
    kwargs = {"tokenize": False, "chat_template": template(family)}
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, **kwargs)
    last = last_user_index(messages)
    spans, at = [], 0  # each content's place, found in order (a template may move or change one)
    for message in messages:
        found = rendered.find(message["content"], at)
        if found < 0:
            break
        spans.append((found, found + len(message["content"])))
        at = spans[-1][1]
    if len(spans) < len(messages):  # the turn's own content
        start = max(rendered.rfind(messages[last]["content"]), 0)
    elif not last:
        start = 0
    else:  # where the turns before it render to, else the line after the previous message's content
        head = tokenizer.apply_chat_template(messages[:last], add_generation_prompt=False, **kwargs)
        newline = rendered.find("\n", spans[last - 1][1], spans[last][0])
        start = len(head) if rendered.startswith(head) else newline + 1 if newline >= 0 else spans[last][0]
    encoded = tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=True)
    offsets = [s for s, _ in encoded.offset_mapping]
    inside = sum(1 for s in offsets if s >= start)
    if inside > LONG_TURN_TOKENS:  # documents before the question: its last QUERY_TOKENS tokens are the question
        start = offsets[len(offsets) - QUERY_TOKENS]
    return rendered, rendered[:start]


def renderings(tokenizer, family: str, requests: list[list[Message]]) -> list[tuple[str, str]]:
    """(rendered prompt, its text before the question) for each request."""
    return [before_question(tokenizer, family, messages) for messages in requests]


def first_break(rendered: list[tuple[str, str]]) -> str | None:
    """Where an earlier request's context stops being a prefix of the next request's prompt; None if never."""
    for k, ((_, context), (after, _)) in enumerate(zip(rendered, rendered[1:]), start=1):
        if not after.startswith(context):
            at = next((i for i, (a, b) in enumerate(zip(context, after)) if a != b), min(len(context), len(after)))
            return f"request {k} -> {k + 1} at char {at}: {context[at:at + 60]!r} became {after[at:at + 60]!r}"
    return None


def test_every_template_is_classified() -> None:
    assert sorted(p.stem for p in TEMPLATES.glob("*.jinja")) == sorted(EXPECTED)
    sources = (TEMPLATES / "SOURCES.md").read_text()
    assert all(f"`{family}.jinja`" in sources for family in EXPECTED)


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_growing_chat(tokenizer, family: str) -> None:
    expected = EXPECTED[family]
    rendered = renderings(tokenizer, family, chat_requests(expected.system))
    assert all(len(context) > len(DOCUMENT) for _, context in rendered[1:])  # the document is context
    problem = first_break(rendered)
    assert (problem is None) == expected.chat, problem or "prefix-stable, but EXPECTED says it is not"


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_agent_loop(tokenizer, family: str) -> None:
    expected = EXPECTED[family]
    if expected.agent is None:
        with pytest.raises(jinja2.exceptions.TemplateError, match="roles must alternate"):
            renderings(tokenizer, family, agent_requests(expected.system))
        return
    problem = first_break(renderings(tokenizer, family, agent_requests(expected.system)))
    assert (problem is None) == expected.agent, problem or "prefix-stable, but EXPECTED says it is not"


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_date_in_rendering(tokenizer, family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    requests = chat_requests(EXPECTED[family].system, turns=2)
    days = []
    for day in (dt.date(2025, 3, 1), dt.date(2025, 3, 2)):
        monkeypatch.setattr(chat_template_utils, "datetime", frozen_clock(day))
        days.append(renderings(tokenizer, family, requests))
    assert (days[0] != days[1]) == EXPECTED[family].dated
