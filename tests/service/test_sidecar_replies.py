"""What a client of the sidecar gets back, in front of a real llama.cpp server (SmolLM2 GGUF, a 4096-token window,
Qwen2.5's chat template so that tools are rendered and calls constrained to their schema): each conversation API's
answer in its own shape, streamed as not; each reason a request went through as it came, said and counted;
frozen history per API key; the retrieve tool on every API beside the client's own tools."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from ilre.service.common.config import SidecarConfig
from ilre.service.server import ServiceThread

from ilre.contract.conversation import read_conversation

from .agent_steps import (APIS, agent_step, answer_text, assert_only_the_tool_output_changed, streamed_text,
                          tool_output_of)
from .conftest import service_config
from .engines import LlamaServer, RecordingRelay
from .haystacks import FACT, haystack

pytestmark = pytest.mark.slow

CODE = "7302946"
KEYS = ("key-a", "key-b")
REQUIRED = {"openai.chat": "required", "openai.responses": "required", "anthropic.messages": {"type": "any"}}
CALL_BEGUN = "<tool_call>\n"  # the answer begun as a call (Qwen2.5's format): the grammar writes the rest
BEGUN = {"openai.chat": {"role": "assistant", "content": CALL_BEGUN},
         "openai.responses": {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": CALL_BEGUN}]},
         "anthropic.messages": {"role": "assistant", "content": CALL_BEGUN}}


@pytest.fixture(scope="module")
def relay():
    server = LlamaServer(4096, None, "--jinja", "--chat-template-file", "tests/service/chat_templates/qwen2_5.jinja")
    recorder = RecordingRelay(server.port)
    yield recorder
    recorder.close()
    server.stop()


def sidecar(engine, url: str, **settings) -> ServiceThread:
    """A sidecar on the shared engine with two API keys and a fixed document secret (the same hashes in the notes,
    hence the same prompts, run after run)."""
    config = service_config({"ILRE_API_KEYS": ",".join(KEYS), "ILRE_DOCUMENT_SECRET": "replies-" * 4})
    return ServiceThread(config, engine, sidecar=SidecarConfig(engine_url=url, engine_api="llamacpp", **settings),
                         tokenizer=engine.tokenizer)


@pytest.fixture(scope="module")
def http(engine, relay):
    names = engine.names  # the shared engine's own ids again after the module
    with sidecar(engine, relay.url) as svc, httpx.Client(base_url=f"http://127.0.0.1:{svc.http_port}", timeout=600,
                                                         headers={"authorization": f"Bearer {KEYS[0]}"}) as client:
        yield client
    engine.names = names


def sent_to(relay: RecordingRelay, path: str, since: int = 0) -> list[dict]:
    """The bodies the engine got on `path` after its first `since` requests."""
    return [r.json() for r in relay.requests()[since:] if r.path == path]


def events(reply: httpx.Response) -> list[dict]:
    """The JSON payloads of an SSE answer, [DONE] left out."""
    return [json.loads(line[5:]) for line in reply.iter_lines() if line.startswith("data:") and line[5:].strip() != "[DONE]"]


@pytest.fixture(scope="module")
def tool_output(engine):
    return haystack(engine.tokenizer, 3000, "pydoc")


LIMITS = {"openai.chat": "max_tokens", "openai.responses": "max_output_tokens", "anthropic.messages": "max_tokens"}


@pytest.mark.parametrize("api", sorted(APIS))
def test_each_api_answers_in_its_shape_and_streams_the_same_text(relay, http, tool_output, api):
    body = agent_step(api, tool_output, temperature=0, **{LIMITS[api]: 16})
    reply = http.post(APIS[api], json=body, headers={"x-ilre-budget": "512"})
    assert reply.status_code == 200 and reply.headers["x-ilre-action"] == "compressed", reply.text
    kept = assert_only_the_tool_output_changed(api, relay.last(APIS[api]).json(), body)
    assert FACT.strip() in kept
    text = answer_text(api, reply.json())
    with http.stream("POST", APIS[api], json={**body, "stream": True}, headers={"x-ilre-budget": "512"}) as streamed:
        assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
        assert streamed.headers["x-ilre-action"] == "compressed"
        chunks = events(streamed)
    *_, whole, asked = sent_to(relay, APIS[api])
    assert asked == {**whole, "stream": True}  # the same prompt
    assert streamed_text(api, chunks) == text and text


def passthrough_counts(client: httpx.Client) -> dict[str, float]:
    """ilre_sidecar_passthrough_total by reason, from the sidecar's metrics."""
    text = client.get("/ilre/metrics").text
    return {m[0]: float(m[1]) for m in re.findall(r'^ilre_sidecar_passthrough_total\{reason="(\w+)"\} ([\d.e+]+)$', text, re.M)}


def test_each_reason_to_pass_a_request_through_is_said_and_counted(engine, relay, http, tool_output):
    """Every passthrough cause: the engine's own answer comes back (its status and body, as if sent to it
    directly), x-ilre-action passthrough, x-ilre-reason in words, ilre_sidecar_passthrough_total{reason} one up."""
    short = haystack(engine.tokenizer, 400, "pydoc")
    cases = [
        ("fits_budget", "/completion", {"prompt": short, "n_predict": 4, "temperature": 0}, "fits the budget"),
        ("fits_budget", "/v1/chat/completions", agent_step("openai.chat", "a short result", max_tokens=4, temperature=0),
         "fits the budget"),
        ("no_context", "/completion", {"prompt": "Hello there, how are you?", "n_predict": 4, "temperature": 0},
         "no context before the query"),
        ("no_prompt", "/v1/completions", {"prompt": [short, short], "max_tokens": 4}, "no single text or token-ID prompt"),
        ("not_readable", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}], "max_tokens": 4},
         "messages[0].content: must be a string, a list of parts or null"),
    ]
    for cause, path, body, reason in cases:
        before = passthrough_counts(http)
        reply = http.post(path, json=body)
        direct = httpx.post(relay.url + path, json=body, timeout=120)
        assert reply.status_code == direct.status_code, (cause, reply.text)
        assert reply.headers["x-ilre-action"] == "passthrough" and reply.headers["x-ilre-reason"] == reason, cause
        assert sent_to(relay, path)[-2] == body  # forwarded as it came (then sent directly)
        if reply.status_code == 200:
            assert reply.json().keys() == direct.json().keys()
        after = passthrough_counts(http)
        assert after[cause] == before.get(cause, 0) + 1 and sum(after.values()) == sum(before.values()) + 1, cause
    with sidecar(engine, relay.url, forward="text") as svc:  # an engine sent text: token IDs cannot be read as ours
        url, auth = f"http://127.0.0.1:{svc.http_port}", {"authorization": f"Bearer {KEYS[0]}"}
        ids = engine.tokenizer(tool_output).input_ids
        reply = httpx.post(url + "/completion", json={"prompt": ids, "n_predict": 2}, headers=auth, timeout=120)
        assert reply.headers["x-ilre-action"] == "passthrough", reply.text
        assert reply.headers["x-ilre-reason"] == "token IDs of another tokenizer"
        assert passthrough_counts(httpx.Client(base_url=url, headers=auth)) == {"other_tokenizer": 1.0}


def agent_chat(results: list[str], question: str) -> list[dict]:
    messages = [{"role": "system", "content": "Answer from the files you read."}]
    for i, result in enumerate(results):
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"call_{i}", "content": result}]
    return messages + [{"role": "user", "content": question}]


def test_frozen_history_sends_each_message_as_first_sent_to_its_key(engine, relay, http, tool_output):
    """Two keys, the same tool results, different questions: each key's later steps send each message as the very
    text first sent to that key (its engine's prefix cache holds), compressed for that key's first question."""
    from ilre.evaluation.tasks.haystack import shakespeare_text

    results = [tool_output, shakespeare_text()[30000:37000], shakespeare_text()[40000:47000]]
    questions = {KEYS[0]: "What is the vault code of the Duke of Milan's museum?",
                 KEYS[1]: "Which built-in function returns the length of an object?"}
    sent: dict[str, list[list[str]]] = {key: [] for key in KEYS}
    for step in range(1, 4):
        for key, question in questions.items():
            body = {"messages": agent_chat(results[:step], f"{question} (step {step})"), "max_tokens": 2, "temperature": 0}
            reply = http.post("/v1/chat/completions", json=body,
                              headers={"authorization": f"Bearer {key}", "x-ilre-history": "frozen", "x-ilre-budget": "500"})
            assert reply.status_code == 200 and reply.json()["object"] == "chat.completion", reply.text
            forwarded = relay.last("/v1/chat/completions").json()["messages"]
            sent[key].append([m["content"] for m in forwarded if m["role"] == "tool"])
    for key in KEYS:
        first, second, third = sent[key]
        assert second[0] == first[0] and third[:2] == second[:2]  # every later step: the text first sent
        assert len(first[0]) < len(results[0])
    assert sent[KEYS[0]][0][0] != sent[KEYS[1]][0][0]  # each key's own, for its own question
    assert FACT.strip() in sent[KEYS[0]][2][0]


@pytest.mark.parametrize("api", sorted(APIS))
def test_retrieve_is_answered_on_every_api_beside_the_clients_own_tools(engine, relay, http, api):
    """The model made to call ilre_retrieve (its answer begun as that call; the engine's grammar writes the arguments,
    a hash the sidecar named; the client's read_file offered beside it): the sidecar answers the call from its cache with the original, withdraws its tool for the last round, and the client
    gets the engine's last answer in the API's shape with its own tool intact and no trace of ilre's."""
    body = agent_step(api, haystack(engine.tokenizer, 900, "pydoc"), temperature=0, tool_choice=REQUIRED[api],
                      cache_prompt=False, **{LIMITS[api]: 80})  # no slot reuse: the same numbers in any order
    body["input" if api == "openai.responses" else "messages"].append(BEGUN[api])
    since = len(relay.requests())
    reply = http.post(APIS[api], json=body, headers={"x-ilre-budget": "40", "x-ilre-retrieve-rounds": "1"})
    assert reply.status_code == 200, reply.text
    rounds = sent_to(relay, APIS[api], since)
    assert len(rounds) == 2 and reply.headers["x-ilre-retrieve-calls"] == "1", (reply.text[:600], rounds[0]["messages"][-2:])
    names = [t.get("name") or t.get("function", {}).get("name") for t in rounds[0]["tools"]]
    assert names == ["read_file", "ilre_retrieve"]  # offered beside the client's own
    shortened = read_conversation(api, rounds[0]).messages[tool_output_of(api, body)[0]]["content"]
    assert shortened.startswith("[ilre kept")  # the tool result compressed, its note naming the hash
    answered = read_conversation(api, rounds[1]).messages[-1]
    assert answered["role"] == "tool" and CODE in answered["content"]  # the call answered with the original
    assert [t.get("name") or t.get("function", {}).get("name") for t in rounds[1]["tools"]] == ["read_file"]
    assert rounds[1].get("tool_choice") == REQUIRED[api]  # the client's own, kept (its read_file called, perhaps)
    assert "ilre_retrieve" not in reply.text and "[ilre kept" not in reply.text
    answer_text(api, reply.json())  # the API's own shape
