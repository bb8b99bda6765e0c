"""The retrieve tool in each conversation API's own words: how the sidecar offers `ilre_retrieve` to the
model, finds the model's calls of it in an answer, answers them in the conversation, takes the tool
away for the last round, and streams a finished answer to a client that asked for a stream.

One class per API (OpenAI chat, OpenAI Responses, Anthropic Messages); every method takes and returns
plain JSON bodies and leaves what is not the retrieve tool's as it came. The loop that uses them is
in retrieve.py.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Iterator

TOOL_NAME = "ilre_retrieve"
DESCRIPTION = ("Read more of a message that was shortened to fit the context. Give the hash its note names and "
               "what you need from it; returns the parts of the original that answer it.")


def parameters(hashes: list[str]) -> dict[str, Any]:
    """The tool's JSON schema; its hash is one of `hashes` (an engine that constrains tool calls to their
    schema, as vLLM and llama.cpp do for a required or named tool, then writes only hashes that exist)."""
    return {"type": "object", "properties": {
        "hash": {"type": "string", "enum": hashes, "description": "the hash named in the note of the shortened message"},
        "question": {"type": "string", "description": "what you need to read in it"}}, "required": ["hash", "question"]}


@dataclass(frozen=True)
class ToolCall:
    """One call of the retrieve tool: its call id and its arguments (empty strings where not given)."""

    id: str
    hash: str
    question: str


class Dialect:
    """The retrieve tool on one API."""

    def offer(self, body: dict[str, Any], hashes: list[str]) -> dict[str, Any]:
        """`body` with the retrieve tool (for the messages of `hashes`) added to its tools."""
        return {**body, "tools": [*(body.get("tools") or []), self.tool(parameters(hashes))]}

    def tool(self, schema: dict[str, Any]) -> dict[str, Any]:
        """The retrieve tool's definition in the API's shape."""
        raise NotImplementedError

    def withdraw(self, body: dict[str, Any]) -> dict[str, Any]:
        """`body` without the retrieve tool (and without a tool_choice that names it): the last round."""
        tools = [t for t in body.get("tools") or [] if _tool_name(t) != TOOL_NAME]
        out = {k: v for k, v in body.items() if k != "tools"}
        if tools:
            out["tools"] = tools
        if _names_retrieve(body.get("tool_choice")) or not tools:
            out.pop("tool_choice", None)
            out.pop("parallel_tool_calls", None)
        return out

    def calls(self, answer: dict[str, Any]) -> tuple[list[ToolCall], bool]:
        """(the retrieve calls in `answer`, whether it also calls the client's own tools)."""
        raise NotImplementedError

    def answer_calls(self, body: dict[str, Any], answer: dict[str, Any], results: list[tuple[ToolCall, str]]) -> dict[str, Any]:
        """`body` continued: the model's turn with its retrieve calls, then each call's result."""
        raise NotImplementedError

    def strip(self, answer: dict[str, Any]) -> dict[str, Any]:
        """`answer` without retrieve calls (when they came beside calls of the client's tools)."""
        raise NotImplementedError

    def stream(self, answer: dict[str, Any]) -> Iterator[bytes]:
        """A finished answer as the server-sent events the API streams."""
        raise NotImplementedError


class ChatDialect(Dialect):
    """OpenAI chat completions: `tools[].function`, `choices[0].message.tool_calls`, role "tool" results."""

    def tool(self, schema):
        return {"type": "function", "function": {"name": TOOL_NAME, "description": DESCRIPTION, "parameters": schema}}

    def calls(self, answer: dict[str, Any]) -> tuple[list[ToolCall], bool]:
        made = (_first_choice(answer).get("message") or {}).get("tool_calls") or []
        ours = [ToolCall(c.get("id", ""), *_arguments(c.get("function", {}).get("arguments")))
                for c in made if c.get("function", {}).get("name") == TOOL_NAME]
        return ours, len(ours) < len(made)

    def answer_calls(self, body, answer, results):
        calls = [{"id": call.id, "type": "function",
                  "function": {"name": TOOL_NAME, "arguments": json.dumps({"hash": call.hash, "question": call.question})}}
                 for call, _ in results]
        turn = [{"role": "assistant", "content": None, "tool_calls": calls}]
        turn += [{"role": "tool", "tool_call_id": call.id, "content": text} for call, text in results]
        return {**body, "messages": [*body["messages"], *turn]}

    def strip(self, answer):
        choices = []
        for choice in answer.get("choices") or []:
            message = dict(choice.get("message") or {})
            if message.get("tool_calls"):
                message["tool_calls"] = [c for c in message["tool_calls"] if c.get("function", {}).get("name") != TOOL_NAME]
            choices.append({**choice, "message": message})
        return {**answer, "choices": choices}

    def stream(self, answer):
        base = {"id": answer.get("id"), "object": "chat.completion.chunk", "created": answer.get("created", int(time.time())),
                "model": answer.get("model")}
        for choice in answer.get("choices") or []:
            message = choice.get("message") or {}
            delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
            if message.get("tool_calls"):
                delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
            yield _data({**base, "choices": [{"index": choice.get("index", 0), "delta": delta, "finish_reason": None}]})
            yield _data({**base, "choices": [{"index": choice.get("index", 0), "delta": {},
                                              "finish_reason": choice.get("finish_reason")}]})
        if answer.get("usage"):
            yield _data({**base, "choices": [], "usage": answer["usage"]})
        yield b"data: [DONE]\n\n"


class ResponsesDialect(Dialect):
    """OpenAI Responses: `tools[]` of type function, `output[]` items of type function_call,
    `function_call_output` items."""

    def tool(self, schema):
        return {"type": "function", "name": TOOL_NAME, "description": DESCRIPTION, "parameters": schema}

    def calls(self, answer):
        made = [item for item in answer.get("output") or [] if item.get("type") == "function_call"]
        ours = [ToolCall(item.get("call_id", ""), *_arguments(item.get("arguments"))) for item in made
                if item.get("name") == TOOL_NAME]
        return ours, len(ours) < len(made)

    def answer_calls(self, body, answer, results):
        given = body.get("input")
        items = [{"role": "user", "content": given}] if isinstance(given, str) else list(given or [])
        for call, text in results:
            items.append({"type": "function_call", "call_id": call.id, "name": TOOL_NAME,
                          "arguments": json.dumps({"hash": call.hash, "question": call.question})})
            items.append({"type": "function_call_output", "call_id": call.id, "output": text})
        return {**body, "input": items}

    def strip(self, answer):
        output = [item for item in answer.get("output") or []
                  if not (item.get("type") == "function_call" and item.get("name") == TOOL_NAME)]
        return {**answer, "output": output}

    def stream(self, answer):
        sequence = iter(range(1 << 30))
        started = {**answer, "status": "in_progress", "output": []}
        yield _event("response.created", {"response": started, "sequence_number": next(sequence)})
        for index, item in enumerate(answer.get("output") or []):
            yield _event("response.output_item.added", {"output_index": index, "item": item, "sequence_number": next(sequence)})
            if item.get("type") == "message":
                for part_index, part in enumerate(item.get("content") or []):
                    if part.get("type") == "output_text":
                        yield _event("response.output_text.delta", {
                            "item_id": item.get("id"), "output_index": index, "content_index": part_index,
                            "delta": part.get("text", ""), "sequence_number": next(sequence)})
                        yield _event("response.output_text.done", {
                            "item_id": item.get("id"), "output_index": index, "content_index": part_index,
                            "text": part.get("text", ""), "sequence_number": next(sequence)})
            yield _event("response.output_item.done", {"output_index": index, "item": item, "sequence_number": next(sequence)})
        yield _event("response.completed", {"response": answer, "sequence_number": next(sequence)})


class AnthropicDialect(Dialect):
    """Anthropic Messages: `tools[]` with `input_schema`, `tool_use` content blocks, `tool_result` blocks."""

    def tool(self, schema):
        return {"name": TOOL_NAME, "description": DESCRIPTION, "input_schema": schema}

    def calls(self, answer):
        made = [block for block in answer.get("content") or [] if block.get("type") == "tool_use"]
        ours = [ToolCall(b.get("id", ""), *_arguments(b.get("input"))) for b in made if b.get("name") == TOOL_NAME]
        return ours, len(ours) < len(made)

    def answer_calls(self, body, answer, results):
        uses = [{"type": "tool_use", "id": call.id, "name": TOOL_NAME, "input": {"hash": call.hash, "question": call.question}}
                for call, _ in results]
        outcomes = [{"type": "tool_result", "tool_use_id": call.id, "content": text} for call, text in results]
        turn = [{"role": "assistant", "content": uses}, {"role": "user", "content": outcomes}]
        return {**body, "messages": [*body["messages"], *turn]}

    def strip(self, answer):
        content = [b for b in answer.get("content") or [] if not (b.get("type") == "tool_use" and b.get("name") == TOOL_NAME)]
        return {**answer, "content": content}

    def stream(self, answer):
        usage = answer.get("usage") or {}
        yield _event("message_start", {"type": "message_start", "message": {
            **answer, "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {**usage, "output_tokens": 0}}})
        for index, block in enumerate(answer.get("content") or []):
            if block.get("type") == "tool_use":
                start, delta = {**block, "input": {}}, {"type": "input_json_delta", "partial_json": json.dumps(block.get("input", {}))}
            else:
                start, delta = {**block, "text": ""}, {"type": "text_delta", "text": block.get("text", "")}
            yield _event("content_block_start", {"type": "content_block_start", "index": index, "content_block": start})
            yield _event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            yield _event("content_block_stop", {"type": "content_block_stop", "index": index})
        yield _event("message_delta", {"type": "message_delta", "delta": {"stop_reason": answer.get("stop_reason"),
                                                                          "stop_sequence": answer.get("stop_sequence")},
                                       "usage": {"output_tokens": usage.get("output_tokens", 0)}})
        yield _event("message_stop", {"type": "message_stop"})


DIALECTS: dict[str, Dialect] = {"openai.chat": ChatDialect(), "openai.responses": ResponsesDialect(),
                                "anthropic.messages": AnthropicDialect()}


def _tool_name(tool: Any) -> str | None:
    if not isinstance(tool, dict):
        return None
    function = tool.get("function")
    return function.get("name") if isinstance(function, dict) else tool.get("name")


def _names_retrieve(choice: Any) -> bool:
    """A tool_choice that forces the retrieve tool (any API's shape)."""
    return isinstance(choice, dict) and TOOL_NAME in (choice.get("name"), (choice.get("function") or {}).get("name"))


def _arguments(raw: Any) -> tuple[str, str]:
    """(hash, question) of a call's arguments: a JSON object, or its text ("" for what is missing or malformed)."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            raw = {}
    if not isinstance(raw, dict):
        raw = {}
    return str(raw.get("hash") or ""), str(raw.get("question") or "")


def _first_choice(answer: dict[str, Any]) -> dict[str, Any]:
    choices = answer.get("choices") or [{}]
    return choices[0] if isinstance(choices[0], dict) else {}


def _data(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    if "type" not in payload:
        payload = {"type": kind, **payload}
    return f"event: {kind}\n".encode() + _data(payload)
