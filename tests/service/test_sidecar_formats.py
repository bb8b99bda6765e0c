"""The sidecar's request shapes, checked against the engines' own request classes (their fields as
declared in SGLang's `python/sglang/srt/managers/io_struct.py` GenerateReqInput and vLLM's
`vllm/entrypoints/openai/completion/protocol.py` CompletionRequest; neither package runs on a CPU
machine), the SSE reshaping, the option precedence, and the chat split on the real tokenizer."""

from __future__ import annotations

import asyncio
import json

import pytest

from ilre.engine.messages import InputError
from ilre.service.sidecar.formats import (LlamaCppCompletion, OpenAIChat, OpenAICompletions, SGLangGenerate,
                                                    chat_chunk_from_completion, chat_from_completion, chat_id, map_sse)
from ilre.service.sidecar.options import CompressionOptions
from ilre.service.sidecar.prompt import PromptSplitter, rebuild_messages

# SGLang GenerateReqInput: exactly one of these carries the prompt
SGLANG_PROMPT_FIELDS = {"text", "input_ids", "input_embeds"}
# vLLM CompletionRequest (OpenAI fields, then vLLM's sampling extras used here)
VLLM_COMPLETION_FIELDS = {"model", "prompt", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
                          "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature",
                          "top_p", "user", "top_k", "min_p", "repetition_penalty", "response_format"}


def test_sglang_generate_carries_input_ids_instead_of_text_and_nothing_else_changes():
    body = {"text": "long ...", "sampling_params": {"max_new_tokens": 8, "stop": ["\n"]}, "stream": True,
            "rid": "a", "return_logprob": False, "data_parallel_rank": 1}
    fmt = SGLangGenerate()
    assert fmt.prompt(body).text == "long ..."
    path, out = fmt.with_ids(body, [5, 6, 7])
    assert path == "/generate"
    assert set(out) & SGLANG_PROMPT_FIELDS == {"input_ids"} and out["input_ids"] == [5, 6, 7]
    assert {k: v for k, v in out.items() if k != "input_ids"} == {k: v for k, v in body.items() if k != "text"}
    assert fmt.prompt({"input_ids": [1, 2, 3]}).ids == [1, 2, 3]
    assert fmt.prompt({"text": ["a", "b"]}) is None and fmt.prompt({"input_ids": [[1], [2]]}) is None  # batches


@pytest.mark.parametrize("fmt", [OpenAICompletions(), LlamaCppCompletion()])
def test_completion_prompts_become_token_id_arrays(fmt):
    body = {"prompt": "hello", "max_tokens": 4, "model": "m", "n_predict": 3}
    path, out = fmt.with_ids(body, [9, 8])
    assert path == fmt.path and out == {**body, "prompt": [9, 8]}
    assert fmt.prompt({"prompt": [1, 2]}).ids == [1, 2]
    assert fmt.prompt({"prompt": [1, "mixed"]}) is None and fmt.prompt({"prompt": ["a", "b"]}) is None
    assert fmt.prompt({"prompt": ""}) is None


def test_chat_as_completion_request_uses_only_completion_fields():
    body = {"model": "m", "messages": [{"role": "user", "content": "q"}], "max_completion_tokens": 20,
            "logprobs": True, "top_logprobs": 3, "temperature": 0.2, "stream": True,
            "stream_options": {"include_usage": True}, "stop": ["x"], "seed": 7, "chat_template_kwargs": {"a": 1}}
    path, out = OpenAIChat().with_ids(body, [3, 4, 5])
    assert path == "/v1/completions"
    assert set(out) <= VLLM_COMPLETION_FIELDS, set(out) - VLLM_COMPLETION_FIELDS
    assert out["prompt"] == [3, 4, 5] and all(isinstance(i, int) and i >= 0 for i in out["prompt"])
    assert out["max_tokens"] == 20 and out["logprobs"] == 3 and out["temperature"] == 0.2


def test_chat_prompts_need_text_contents():
    chat = OpenAIChat()
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}
    assert chat.prompt(parts).messages[0]["content"] == "ab"
    image = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    assert chat.prompt(image) is None and chat.prompt({"messages": []}) is None
    assert chat.needs_chat_route({"tools": [{"type": "function"}]}) and not chat.needs_chat_route({"tools": []})


def test_completion_answers_are_reshaped_into_chat_answers():
    completion = {"id": "cmpl-c1", "object": "text_completion", "created": 5, "model": "m",
                  "choices": [{"index": 0, "text": " 42", "logprobs": None, "finish_reason": "stop"}],
                  "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}}
    chat = chat_from_completion(completion)
    assert chat["object"] == "chat.completion" and chat["usage"] == completion["usage"]
    assert chat["id"] == "chatcmpl-c1"  # named as the engines name their chat answers
    assert chat["choices"] == [{"index": 0, "message": {"role": "assistant", "content": " 42"}, "logprobs": None,
                                "finish_reason": "stop"}]


def test_chat_ids_follow_the_engines_convention():
    assert [chat_id(i) for i in ("cmpl-9f", "chatcmpl-9f", "9f")] == ["chatcmpl-9f"] * 3
    assert chat_id(None).startswith("chatcmpl-") and chat_id(None) != chat_id(None)


def run_sse(chunks: list[bytes]) -> list[bytes]:
    async def collect():
        async def source():
            for chunk in chunks:
                yield chunk
        started: set[int] = set()
        return [e async for e in map_sse(source(), lambda d: chat_chunk_from_completion(d, started))]
    return asyncio.run(collect())


def test_sse_events_are_reshaped_one_by_one_across_chunk_boundaries():
    events = [{"id": "c", "choices": [{"index": 0, "text": t, "finish_reason": None}]} for t in ("He", "llo")]
    stream = b"".join(b"data: " + json.dumps(e).encode() + b"\r\n\r\n" for e in events)
    stream += b'data: {"error": {"message": "boom"}}\n\n: keep-alive comment\n\ndata: [DONE]\n\n'
    out = run_sse([stream[i:i + 7] for i in range(0, len(stream), 7)])  # split anywhere
    payloads = [e.split(b"data: ", 1)[1].rstrip() for e in out if b"data: " in e]
    first, second = json.loads(payloads[0]), json.loads(payloads[1])
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "He"}
    assert second["choices"][0]["delta"] == {"content": "llo"}
    assert first["id"] == second["id"] == "chatcmpl-c"
    assert json.loads(payloads[2]) == {"error": {"message": "boom"}}  # errors pass unchanged
    assert payloads[3] == b"[DONE]" and any(e.startswith(b": keep-alive") for e in out)


def test_options_precedence_defaults_then_headers_then_body():
    defaults = CompressionOptions(query_tokens=32)
    assert defaults.resolve({}, None) == defaults
    headed = defaults.resolve({"x-ilre-budget": "500", "x-ilre-query-tokens": "16", "x-ilre-compress": "off"}, None)
    assert (headed.budget, headed.query_tokens, headed.enabled) == (500, 16, False)
    both = defaults.resolve({"x-ilre-budget": "500"}, {"ratio": 0.25, "enabled": True})
    assert (both.budget, both.ratio, both.enabled) == (None, 0.25, True)  # the body's ratio replaces the header's budget
    assert both.request_fields() == {"ratio": 0.25}
    with pytest.raises(InputError) as err:
        defaults.resolve({}, {"budget": True})
    assert err.value.field == "compression.budget"


def test_granularity_option_from_defaults_headers_and_body():
    defaults = CompressionOptions()
    assert "granularity" not in defaults.resolve({}, None).request_fields()  # the server's default applies
    headed = defaults.resolve({"x-ilre-granularity": "unit"}, None)
    assert headed.request_fields() == {"granularity": "unit"}
    assert defaults.resolve({"x-ilre-granularity": "unit"}, {"granularity": "token"}).granularity == "token"
    for headers, body, field in (({"x-ilre-granularity": "sentence"}, None, "x-ilre-granularity"),
                                 ({}, {"granularity": "sentence"}, "compression.granularity"),
                                 ({"x-ilre-granularity": "unit"}, {"granularity": 1}, "compression.granularity")):
        with pytest.raises(InputError) as err:
            defaults.resolve(headers, body)
        assert err.value.field == field
        assert str(err.value).startswith(f"{field}: must be one of token, unit (got ")


@pytest.fixture(scope="module")
def splitter(engine):
    return PromptSplitter(engine.tokenizer)


def test_plain_split_takes_the_last_query_tokens(splitter):
    ids = list(range(10, 110))
    split = splitter.plain(ids, 64, from_text=True)
    assert (split.prefix, split.context, split.query) == ([], ids[:36], ids[36:])
    assert splitter.plain(ids[:10], 64, from_text=False).context == []


def test_chat_split_is_the_last_user_turn_and_text_forwarding_rebuilds_messages(splitter, engine):
    messages = [{"role": "system", "content": "Read this. " * 40},
                {"role": "user", "content": "First question?"}, {"role": "assistant", "content": "First answer."},
                {"role": "user", "content": "Second question?"}]
    split = splitter.chat(messages, 64, {})
    query_text = engine.tokenizer.decode(split.query)
    assert query_text.startswith("<|im_start|>user\nSecond question?") and query_text.endswith("<|im_start|>assistant\n")
    assert "First answer." in engine.tokenizer.decode(split.context)
    kept = list(range(0, len(split.context), 3))
    rebuilt = rebuild_messages(messages, split, kept)
    assert rebuilt[3] == messages[3]  # the query turn is untouched
    assert [m["role"] for m in rebuilt] == [m["role"] for m in messages]
    assert all(len(new["content"]) < len(old["content"]) for new, old in zip(rebuilt[:3], messages[:3]))
    for message, (start, end) in zip(rebuilt[:3], split.spans):  # a literal loop over the kept tokens
        inside = [split.rendered[s:e] for s, e in split.offsets[kept].tolist() if start <= s < end]
        assert message["content"] == "".join(inside)  # role headers and end markers belong to no message


def test_a_document_in_the_last_question_is_split_by_query_tokens(splitter):
    messages = [{"role": "user", "content": "word " * 3000 + "What came first?"}]
    split = splitter.chat(messages, 64, {})
    assert len(split.query) == 64 and len(split.context) > 2900
