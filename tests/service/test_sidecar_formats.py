"""The sidecar's request shapes, checked against the engines' own request classes (their fields as
declared in SGLang's `python/sglang/srt/managers/io_struct.py` GenerateReqInput and vLLM's
`vllm/entrypoints/openai/completion/protocol.py` CompletionRequest; neither package runs on a CPU
machine), the option precedence, and the plain split on the real tokenizer (conversations:
tests/engine/test_conversation.py)."""

from __future__ import annotations

import pytest

from ilre.contract.messages import InputError
from ilre.service.sidecar.formats import FORMATS, LlamaCppCompletion, OpenAIChat, OpenAICompletions, SGLangGenerate
from ilre.service.sidecar.options import CompressionOptions
from ilre.service.sidecar.prompt import PromptSplitter

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


def test_conversation_routes_are_served_on_the_engines_own_paths():
    routes = {fmt.path: fmt.conversation for fmt in FORMATS if fmt.conversation}
    assert routes == {"/v1/chat/completions": "openai.chat", "/v1/responses": "openai.responses",
                      "/v1/messages": "anthropic.messages"}
    assert OpenAIChat().conversation == "openai.chat"


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
