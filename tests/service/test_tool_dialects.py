"""The retrieve tool in each API's words, on answer shapes as the APIs document them: the calls found in
an answer, the conversation continued with their results (still a conversation the sidecar reads), the
tool withdrawn, a finished answer streamed as the API's events."""

from __future__ import annotations

import json

import pytest

from ilre.contract.conversation import read_conversation
from ilre.service.sidecar.tool_dialects import DIALECTS, TOOL_NAME

from .agent_steps import agent_step

HASH = "0123456789abcdef"
ARGUMENTS = {"hash": HASH, "question": "the vault code"}

ANSWERS = {  # an answer calling the retrieve tool and a tool of the client's
    "openai.chat": {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "choices": [
        {"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_r", "type": "function", "function": {"name": TOOL_NAME, "arguments": json.dumps(ARGUMENTS)}},
            {"id": "call_c", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\": \"a\"}"}}]}}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}},
    "openai.responses": {"id": "resp_1", "object": "response", "status": "completed", "model": "m", "output": [
        {"type": "function_call", "id": "fc_r", "call_id": "call_r", "name": TOOL_NAME, "arguments": json.dumps(ARGUMENTS)},
        {"type": "function_call", "id": "fc_c", "call_id": "call_c", "name": "read_file", "arguments": "{}"}]},
    "anthropic.messages": {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "tool_use",
                           "content": [{"type": "tool_use", "id": "toolu_r", "name": TOOL_NAME, "input": ARGUMENTS},
                                       {"type": "tool_use", "id": "toolu_c", "name": "read_file", "input": {}}],
                           "usage": {"input_tokens": 9, "output_tokens": 5}},
}


@pytest.mark.parametrize("api", sorted(DIALECTS))
def test_calls_are_found_answered_and_stripped(api):
    dialect, answer = DIALECTS[api], ANSWERS[api]
    body = dialect.offer(agent_step(api, "the tool's result"), [HASH])
    assert len(body["tools"]) == 2 and json.dumps(body["tools"][-1]).count(HASH) == 1  # the client's tool, then ours
    calls, theirs = dialect.calls(answer)
    assert [(c.hash, c.question) for c in calls] == [(HASH, "the vault code")] and theirs
    continued = dialect.answer_calls(body, answer, [(calls[0], "The vault code is 7302946.")])
    read = read_conversation(api, continued).messages
    assert read[-1] == {"role": "tool", "content": "The vault code is 7302946."}  # a tool result, last
    assert read[:len(read_conversation(api, body).messages)] == read_conversation(api, body).messages
    stripped = dialect.strip(answer)
    assert TOOL_NAME not in json.dumps(stripped) and "read_file" in json.dumps(stripped)
    assert dialect.calls(stripped) == ([], True)


@pytest.mark.parametrize("api", sorted(DIALECTS))
def test_the_tool_is_withdrawn_with_a_choice_that_names_it(api):
    dialect = DIALECTS[api]
    named = {"openai.chat": {"type": "function", "function": {"name": TOOL_NAME}},
             "openai.responses": {"type": "function", "name": TOOL_NAME},
             "anthropic.messages": {"type": "tool", "name": TOOL_NAME}}[api]
    body = dialect.offer({**agent_step(api, "r"), "tool_choice": named}, [HASH])
    out = dialect.withdraw(body)
    assert TOOL_NAME not in json.dumps(out) and len(out["tools"]) == 1
    alone = dialect.withdraw(dialect.offer({**agent_step(api, "r"), "tool_choice": "required"} | {"tools": []}, [HASH]))
    assert "tools" not in alone and "tool_choice" not in alone  # no tool left to require


def events(stream) -> list[dict]:
    return [json.loads(line[5:]) for chunk in stream for line in chunk.decode().splitlines()
            if line.startswith("data:") and line[5:].strip() != "[DONE]"]


def test_finished_answers_stream_as_each_api_does():
    chat = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "usage": {"prompt_tokens": 3},
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "7302946"}}]}
    chunks = events(DIALECTS["openai.chat"].stream(chat))
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and chunks[-1]["usage"] == {"prompt_tokens": 3}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "7302946"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]] == [None, "stop"]

    response = {"id": "resp_1", "object": "response", "status": "completed", "output": [
        {"type": "message", "id": "msg_1", "role": "assistant", "content": [{"type": "output_text", "text": "7302946"}]}]}
    kinds = [e["type"] for e in events(DIALECTS["openai.responses"].stream(response))]
    assert kinds == ["response.created", "response.output_item.added", "response.output_text.delta",
                     "response.output_text.done", "response.output_item.done", "response.completed"]

    message = {"id": "msg_1", "type": "message", "role": "assistant", "stop_reason": "end_turn",
               "content": [{"type": "text", "text": "7302946"}], "usage": {"input_tokens": 3, "output_tokens": 2}}
    streamed = events(DIALECTS["anthropic.messages"].stream(message))
    assert [e["type"] for e in streamed] == ["message_start", "content_block_start", "content_block_delta",
                                             "content_block_stop", "message_delta", "message_stop"]
    assert streamed[2]["delta"] == {"type": "text_delta", "text": "7302946"}
    assert streamed[4]["delta"]["stop_reason"] == "end_turn"
