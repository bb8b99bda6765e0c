"""One step of a tool-using agent as each API carries it (shapes as the APIs' documentation gives them):
the instructions, the user's task, the model's call of a `read_file` tool, the tool's result and the
user's question. The tool's result is the one text the sidecar may compress."""

from __future__ import annotations

from typing import Any

from ilre.contract.conversation import read_conversation

from .haystacks import CHAT_QUESTION

APIS = {"openai.chat": "/v1/chat/completions", "openai.responses": "/v1/responses", "anthropic.messages": "/v1/messages"}
INSTRUCTIONS = "You are a careful assistant. Answer from the files you read."
TASK = "Read notes/museum.txt, then answer my question."
IMAGE_URL = "https://example.com/museum.png"
PARAMETERS = {"type": "object", "properties": {"path": {"type": "string", "description": "the file to read"}},
              "required": ["path"]}
ARGUMENTS = '{"path": "notes/museum.txt"}'


def agent_step(api: str, tool_output: str, question: str = CHAT_QUESTION, image: bool = False,
               **extra: Any) -> dict[str, Any]:
    """The body of one agent step on `api` ("openai.chat", "openai.responses", "anthropic.messages");
    image: the question carries an image too (an engine without vision refuses it)."""
    return {"openai.chat": _chat, "openai.responses": _responses, "anthropic.messages": _anthropic}[api](
        tool_output, question, image) | {"model": "smollm2", **extra}


def _chat(output: str, question: str, image: bool) -> dict[str, Any]:
    asked: Any = [{"type": "text", "text": question}, {"type": "image_url", "image_url": {"url": IMAGE_URL}}] if image else question
    return {"tools": [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                                        "parameters": PARAMETERS}}],
            "messages": [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": TASK},
                         {"role": "assistant", "content": None, "tool_calls": [
                             {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": ARGUMENTS}}]},
                         {"role": "tool", "tool_call_id": "call_1", "content": output},
                         {"role": "user", "content": asked}]}


def _responses(output: str, question: str, image: bool) -> dict[str, Any]:
    asked: list[dict[str, Any]] = [{"type": "input_text", "text": question}]
    if image:
        asked.append({"type": "input_image", "image_url": IMAGE_URL})
    return {"instructions": INSTRUCTIONS,
            "tools": [{"type": "function", "name": "read_file", "description": "Read a file", "parameters": PARAMETERS}],
            "input": [{"role": "user", "content": TASK},
                      {"type": "function_call", "call_id": "call_1", "name": "read_file", "arguments": ARGUMENTS},
                      {"type": "function_call_output", "call_id": "call_1", "output": output},
                      {"role": "user", "content": asked}]}


def _anthropic(output: str, question: str, image: bool) -> dict[str, Any]:
    asked: list[dict[str, Any]] = [{"type": "text", "text": question}]
    if image:
        asked.append({"type": "image", "source": {"type": "url", "url": IMAGE_URL}})
    return {"system": INSTRUCTIONS, "max_tokens": 64,
            "tools": [{"name": "read_file", "description": "Read a file", "input_schema": PARAMETERS}],
            "messages": [{"role": "user", "content": TASK},
                         {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "read_file",
                                                            "input": {"path": "notes/museum.txt"}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": output},
                                                      *asked]}]}


def tool_output_of(api: str, body: dict[str, Any]) -> tuple[int, str]:
    """(index, text) of the tool's result among the body's conversation messages."""
    conversation = read_conversation(api, body)
    (index,) = [i for i, m in enumerate(conversation.messages) if m["role"] == "tool"]
    return index, conversation.messages[index]["content"]


def assert_only_the_tool_output_changed(api: str, sent: dict[str, Any], body: dict[str, Any]) -> str:
    """The engine got `body` but for the tool's result (everything else equal, field by field: tool
    calls and their arguments, tool definitions, images, ids, order); returns the result it got."""
    index, original = tool_output_of(api, body)
    _, forwarded = tool_output_of(api, sent)
    assert read_conversation(api, sent).write(sent, {index: original}) == body
    return forwarded


def prompt_tokens(api: str, answer: dict) -> int:
    """The prompt tokens the engine reports in an answer of `api`."""
    return answer["usage"]["prompt_tokens" if api == "openai.chat" else "input_tokens"]


def answer_text(api: str, answer: dict) -> str:
    """The text of an answer in `api`'s own shape (which it must have)."""
    if api == "openai.chat":
        assert answer["object"] == "chat.completion"
        return answer["choices"][0]["message"]["content"] or ""
    if api == "openai.responses":
        assert answer["object"] == "response" and answer["status"] == "completed"
        return "".join(part["text"] for item in answer["output"] if item["type"] == "message" for part in item["content"])
    assert answer["type"] == "message" and answer["role"] == "assistant"
    return "".join(block["text"] for block in answer["content"] if block["type"] == "text")


STREAM_EVENTS = {"openai.chat": "chat.completion.chunk", "openai.responses": "response.completed",
                 "anthropic.messages": "message_stop"}


def streamed_text(api: str, events: list[dict]) -> str:
    """The text of a streamed answer of `api`, put together from its events (their kinds the API's own)."""
    if api == "openai.chat":
        assert {e["object"] for e in events} == {"chat.completion.chunk"}
        return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    if api == "openai.responses":
        return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    return "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta"
                   and e["delta"]["type"] == "text_delta")
