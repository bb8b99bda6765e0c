"""Each API's conversation read as plain messages and written back, on request shapes as the APIs' own
documentation gives them (OpenAI's function-calling and vision guides, the Responses API's
function-calling guide, Anthropic's tool-use and prompt-caching guides): what is text, what is kept,
which message is the question, and that writing a text back changes that text alone."""

from __future__ import annotations

import copy
import json

import pytest

from ilre.contract.chat import split_chat
from ilre.contract.conversation import NotReadable, read_conversation

TOOL_OUTPUT = "def parse(text):\n    return json.loads(text)\n" * 50  # a long tool result
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Get the weather",
                                                  "parameters": {"type": "object", "properties": {"location": {"type": "string"}},
                                                                 "required": ["location"]}}}

OPENAI_CHAT = {
    "model": "m", "tools": [WEATHER_TOOL], "tool_choice": "auto",
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Read parse.py and tell me what it returns."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_abc123", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\": \"parse.py\"}"}}]},
        {"role": "tool", "tool_call_id": "call_abc123", "content": TOOL_OUTPUT},
        {"role": "user", "content": [{"type": "text", "text": "And what is in this image?"},
                                     {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]},
    ]}

RESPONSES = {
    "model": "m", "instructions": "You answer from the tools' results.",
    "tools": [{"type": "function", "name": "read_file", "description": "Read a file",
               "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}],
    "input": [
        {"role": "user", "content": "Read parse.py and tell me what it returns."},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "I should read the file."}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "read_file", "arguments": "{\"path\":\"parse.py\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": TOOL_OUTPUT},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What does it return?"},
                                                         {"type": "input_image", "image_url": "https://example.com/a.png"}]},
    ]}

ANTHROPIC = {
    "model": "m", "max_tokens": 1024,
    "system": [{"type": "text", "text": "You answer from the tools' results.", "cache_control": {"type": "ephemeral"}}],
    "tools": [{"name": "read_file", "description": "Read a file",
               "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}],
    "messages": [
        {"role": "user", "content": "Read parse.py and tell me what it returns."},
        {"role": "assistant", "content": [{"type": "text", "text": "I will read it."},
                                          {"type": "tool_use", "id": "toolu_01A", "name": "read_file", "input": {"path": "parse.py"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01A", "content": TOOL_OUTPUT},
                                     {"type": "text", "text": "What does it return?"}]},
    ]}


def roles_and_texts(conversation) -> list[tuple[str, str | None]]:
    return [(m["role"], m["content"]) for m in conversation.messages]


def test_openai_chat_with_a_tool_call_and_an_image():
    c = read_conversation("openai.chat", OPENAI_CHAT)
    assert roles_and_texts(c) == [("system", "You are a helpful assistant."),
                                  ("user", "Read parse.py and tell me what it returns."),
                                  ("assistant", None), ("tool", TOOL_OUTPUT),
                                  ("user", "And what is in this image?"), ("user", None)]
    assert c.field(3) == "messages[3].content" and c.field(4) == "messages[4].content[0].text"
    split = split_chat(c.messages)
    assert split.last_user == 4 and split.query == "And what is in this image?"
    assert split.compressible == (1, 3)  # the earlier user message and the tool result; never the call


def test_responses_input_items_and_instructions():
    c = read_conversation("openai.responses", RESPONSES)
    assert roles_and_texts(c) == [("system", "You answer from the tools' results."),
                                  ("user", "Read parse.py and tell me what it returns."),
                                  ("assistant", None), ("assistant", None), ("tool", TOOL_OUTPUT),
                                  ("user", "What does it return?"), ("user", None)]
    assert [c.field(i) for i in (0, 4, 5)] == ["instructions", "input[3].output", "input[4].content[0].text"]
    assert split_chat(c.messages).compressible == (1, 4)
    plain = read_conversation("openai.responses", {"model": "m", "input": "Tell me a story."})
    assert roles_and_texts(plain) == [("user", "Tell me a story.")]


def test_anthropic_tool_result_blocks_are_tool_results_and_cache_control_travels():
    c = read_conversation("anthropic.messages", ANTHROPIC)
    assert roles_and_texts(c) == [("system", "You answer from the tools' results."),
                                  ("user", "Read parse.py and tell me what it returns."),
                                  ("assistant", "I will read it."), ("assistant", None),
                                  ("tool", TOOL_OUTPUT), ("user", "What does it return?")]
    assert c.messages[0]["cache_control"] == {"type": "ephemeral"}
    assert [c.field(i) for i in (0, 4, 5)] == ["system[0].text", "messages[2].content[0].content",
                                               "messages[2].content[1].text"]
    split = split_chat(c.messages)
    assert split.last_user == 5 and split.compressible == (1, 4)  # after the pinned system prompt

    blocks = copy.deepcopy(ANTHROPIC)
    blocks["messages"][2]["content"][0]["content"] = [{"type": "text", "text": TOOL_OUTPUT},
                                                      {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]
    c = read_conversation("anthropic.messages", blocks)
    assert roles_and_texts(c)[4:] == [("tool", TOOL_OUTPUT), ("tool", None), ("user", "What does it return?")]
    assert c.field(4) == "messages[2].content[0].content[0].text"


@pytest.mark.parametrize("api,body,index", [("openai.chat", OPENAI_CHAT, 3), ("openai.responses", RESPONSES, 4),
                                            ("anthropic.messages", ANTHROPIC, 4)])
def test_writing_a_text_back_changes_that_text_alone(api, body, index):
    before = json.dumps(body)
    c = read_conversation(api, body)
    out = c.write(body, {index: "kept lines"})
    assert json.dumps(body) == before  # the body sent is not touched
    again = read_conversation(api, out)
    assert again.messages[index]["content"] == "kept lines"
    assert [m for i, m in enumerate(again.messages) if i != index] == [m for i, m in enumerate(c.messages) if i != index]
    assert out["tools"] is body["tools"]  # off the path: the very same objects
    path = c.paths[index]
    assert out[path[0]][path[1] - 1] is body[path[0]][path[1] - 1]
    with pytest.raises(ValueError):
        c.write(body, {2 if api != "anthropic.messages" else 3: "x"})  # a tool call holds no text


@pytest.mark.parametrize("api,body,field", [
    ("openai.chat", {"messages": []}, "messages"),
    ("openai.chat", {"messages": [{"content": "x"}]}, "messages[0].role"),
    ("openai.chat", {"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ("openai.chat", {"messages": [{"role": "user", "content": ["x"]}]}, "messages[0].content[0]"),
    ("openai.responses", {"input": 5}, "input"),
    ("anthropic.messages", {"messages": ["x"]}, "messages[0]"),
])
def test_what_is_not_a_conversation_is_named(api, body, field):
    with pytest.raises(NotReadable) as err:
        read_conversation(api, body)
    assert err.value.field == field
