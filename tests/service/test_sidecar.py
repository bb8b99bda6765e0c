"""The sidecar in front of a real llama.cpp server (SmolLM2 GGUF, a 4096-token window), with a
recording relay between them so that each test reads exactly what the engine received."""

from __future__ import annotations

import json
import logging
import time

import httpx
import pytest

from ilre.contract.messages import CompressRequest
from ilre.service.common.config import SidecarConfig
from ilre.service.common.request_log import JsonFormatter, TEXT_FORMAT
from ilre.service.server import ServiceThread
from ilre.service.sidecar.upstream import IDLE_CONNECTION_S

from .conftest import LINES_QUERY, assert_whole_lines, free_port, lines_context, service_config, wait_for
from .engines import LlamaServer, RecordingRelay, wait_idle
from .agent_steps import APIS, agent_step, assert_only_the_tool_output_changed
from .haystacks import CHAT_QUESTION, FACT, QUESTION, haystack, over_the_window, reference_ids

GREEDY = {"temperature": 0, "top_k": 1}


@pytest.fixture(scope="module")
def llama():
    server = LlamaServer(ctx_size=4096)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def relay(llama):
    recorder = RecordingRelay(llama.port)
    yield recorder
    recorder.close()


def sidecar_service(engine, url: str, **settings) -> ServiceThread:
    sidecar = SidecarConfig(engine_url=url, engine_api="llamacpp", **settings)
    return ServiceThread(service_config(), engine, sidecar=sidecar, tokenizer=engine.tokenizer)


@pytest.fixture(scope="module")
def sidecar(engine, relay):
    with sidecar_service(engine, relay.url) as svc:
        yield svc


@pytest.fixture(scope="module")
def http(sidecar):
    with httpx.Client(base_url=f"http://127.0.0.1:{sidecar.http_port}", timeout=300) as client:
        yield client


@pytest.fixture(scope="module")
def long_prompt(engine):
    return over_the_window(engine.tokenizer)


# -- a prompt longer than the engine's window through every request format -------------------------------
@pytest.mark.slow
def test_plain_prompt_formats_forward_exactly_the_compressed_ids(engine, llama, relay, http, long_prompt):
    ids = engine.tokenizer(long_prompt).input_ids
    assert llama.ctx_size == 4096 < len(ids) <= 4 * 1024 + 64  # its context within the default's candidates
    expected = reference_ids(engine, ids, 64)
    assert len(expected) == 1024 + 64

    # llama.cpp's own /completion: the engine gets the IDs and answers from them
    reply = http.post("/completion", json={"prompt": long_prompt, "n_predict": 12, **GREEDY})
    assert reply.status_code == 200, reply.text
    assert relay.last("/completion").json()["prompt"] == expected
    assert "7302946" in reply.json()["content"]
    assert reply.headers["x-ilre-action"] == "compressed"
    assert int(reply.headers["x-ilre-original-tokens"]) == len(ids)
    assert int(reply.headers["x-ilre-compressed-tokens"]) == len(expected)
    assert float(reply.headers["x-ilre-compress-ms"]) > 0

    # OpenAI completions, compression options in the body: removed before forwarding
    reply = http.post("/v1/completions", json={"prompt": long_prompt, "max_tokens": 12, "temperature": 0,
                                               "compression": {"budget": 1024, "query_tokens": 64}})
    assert reply.status_code == 200, reply.text
    sent = relay.last("/v1/completions").json()
    assert sent["prompt"] == expected and "compression" not in sent and sent["max_tokens"] == 12
    assert "7302946" in reply.json()["choices"][0]["text"]

    # SGLang's /generate: `text` becomes `input_ids`, sampling_params untouched; llama-server has no
    # /generate, so its 404 comes back as it is (the IDs are the ones answered correctly above)
    params = {"max_new_tokens": 12, "temperature": 0.0, "stop": ["\n"]}
    reply = http.post("/generate", json={"text": long_prompt, "sampling_params": params, "rid": "r-1"})
    sent = relay.last("/generate").json()
    assert sent == {"input_ids": expected, "sampling_params": params, "rid": "r-1"}
    assert reply.status_code == 404


@pytest.mark.slow
def test_an_agent_step_with_a_tool_call_in_its_history_is_compressed_and_answered(engine, llama, relay, http):
    """A chat whose history holds an assistant tool call (content null) and a ~12K-token tool result, against
    a 4096-token window: the tool result alone is compressed, the engine answers from it."""
    body = agent_step("openai.chat", haystack(engine.tokenizer, 12000, "pydoc"), max_tokens=24, temperature=0)
    direct = httpx.post(llama.url + "/v1/chat/completions", json=body, timeout=120)
    assert direct.status_code == 400 and "context" in direct.text  # whole, the engine refuses it

    reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-ilre-action"] == "compressed"
    kept = assert_only_the_tool_output_changed("openai.chat", relay.last("/v1/chat/completions").json(), body)
    assert FACT.strip() in kept and len(engine.tokenizer(kept).input_ids) < 1024
    assert int(reply.headers["x-ilre-compressed-tokens"]) <= 1024 < int(reply.headers["x-ilre-original-tokens"])
    answer = reply.json()
    assert answer["object"] == "chat.completion" and "7302946" in answer["choices"][0]["message"]["content"]
    # the engine's prompt: the budget plus what stays whole (instructions, task, call, question, tools, template)
    rest = httpx.post(llama.url + "/v1/chat/completions", timeout=120,
                      json=agent_step("openai.chat", "", max_tokens=1)).json()["usage"]["prompt_tokens"]
    assert answer["usage"]["prompt_tokens"] <= 1024 + rest


def agent_chat(results: list[str]) -> list[dict]:
    """An agent's chat after len(results) tool calls, each answered by its result, then the question."""
    messages = [{"role": "system", "content": "Answer from the files you read."},
                {"role": "user", "content": "Read the files, then answer my question."}]
    for i, result in enumerate(results):
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"call_{i}", "content": result}]
    return messages + [{"role": "user", "content": CHAT_QUESTION}]


@pytest.mark.parametrize("history", ["fresh", "frozen"])
def test_an_agents_steps_keep_the_fact_and_frozen_history_sends_each_message_as_first_sent(engine, relay, http,
                                                                                          history):
    """Three steps of an agent, each adding a ~1,500-token tool result (the fact in the first): each step's tool
    results are asked together and reach the engine compressed, the fact kept, the answer in the chat's shape; in
    frozen mode every later step sends the first result as the very text sent for it at the first step."""
    from ilre.evaluation.tasks.haystack import shakespeare_text

    text = shakespeare_text()
    results = [haystack(engine.tokenizer, 1500, "pydoc")] + [text[k * 7000:(k + 1) * 7000] for k in (3, 4)]
    sent = []
    for step in range(1, 4):
        body = {"messages": agent_chat(results[:step]), "max_tokens": 8, **GREEDY}
        reply = http.post("/v1/chat/completions", json=body, headers={"x-ilre-history": history, "x-ilre-budget": "600"})
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-ilre-action"] == "compressed" and reply.json()["object"] == "chat.completion"
        forwarded = relay.last("/v1/chat/completions").json()["messages"]
        tools = [m["content"] for m in forwarded if m["role"] == "tool"]
        assert len(tools) == step and all(len(t) < len(r) for t, r in zip(tools, results))
        assert FACT.strip() in tools[0]
        assert int(reply.headers["x-ilre-compressed-tokens"]) < int(reply.headers["x-ilre-original-tokens"])
        sent.append(tools)
    if history == "frozen":
        assert sent[1][0] == sent[2][0] == sent[0][0] and sent[2][1] == sent[1][1]


@pytest.mark.parametrize("api", sorted(APIS))
def test_tool_calls_tool_definitions_and_images_reach_the_engine_as_sent(engine, relay, http, api):
    """Each API's agent step with an image in the question: only the tool result changes on its way (the
    engine, without vision, may refuse the image: its answer is relayed as it came)."""
    body = agent_step(api, haystack(engine.tokenizer, 3000, "pydoc"), image=True, max_tokens=8)
    reply = http.post(APIS[api], json=body, headers={"x-ilre-budget": "512"})
    assert reply.headers["x-ilre-action"] == "compressed", reply.text
    kept = assert_only_the_tool_output_changed(api, relay.last(APIS[api]).json(), body)
    assert FACT.strip() in kept and len(engine.tokenizer(kept).input_ids) <= 512


def failures(caplog, rid: str) -> list:
    """The sidecar's log records of the failed request `rid`."""
    return [r for r in caplog.records if r.name == "ilre.sidecar" and r.fields["request_id"] == rid]


@pytest.mark.slow
def test_the_full_prompt_does_not_fit_the_engine_and_its_error_is_relayed(llama, relay, http, long_prompt, caplog):
    direct = httpx.post(llama.url + "/completion", json={"prompt": long_prompt, "n_predict": 4}, timeout=120)
    with caplog.at_level("WARNING", logger="ilre.sidecar"):
        reply = http.post("/completion", json={"prompt": long_prompt, "n_predict": 4},
                          headers={"x-ilre-compress": "off", "x-request-id": "too-long-1"})
    assert direct.status_code == reply.status_code == 400
    assert reply.json() == direct.json() and "context" in reply.json()["error"]["message"]
    assert reply.headers["x-ilre-action"] == "off"
    (logged,) = failures(caplog, "too-long-1")  # a relayed error is logged once, with the engine's words
    assert logged.fields["status"] == 400 and logged.fields["route"] == "llamacpp.completion"
    assert logged.fields["cause"] == "the engine answered /completion: " + direct.json()["error"]["message"]


# -- streaming, pass-through, other paths --------------------------------------------------------
@pytest.fixture(scope="module")
def medium_prompt(engine):
    return haystack(engine.tokenizer, 2500) + QUESTION


def sse_payloads(reply: httpx.Response) -> list[dict]:
    return [json.loads(line[5:]) for line in reply.iter_lines() if line.startswith("data:") and line[5:].strip() != "[DONE]"]


def test_streaming_returns_the_same_text_as_not_streaming(http, medium_prompt):
    body = {"prompt": medium_prompt, "n_predict": 16, **GREEDY, "compression": {"budget": 256}}
    whole = http.post("/completion", json=body)
    assert whole.status_code == 200 and whole.headers["x-ilre-action"] == "compressed"
    with http.stream("POST", "/completion", json={**body, "stream": True}) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        events = sse_payloads(reply)
    assert len(events) > 2  # relayed event by event
    assert "".join(e["content"] for e in events) == whole.json()["content"]


def test_streaming_chat_comes_back_as_the_engines_chat_chunks(http, engine):
    messages = [{"role": "system", "content": haystack(engine.tokenizer, 1500)}, {"role": "user", "content": CHAT_QUESTION}]
    body = {"messages": messages, "max_tokens": 16, "temperature": 0, "compression": {"budget": 256}}
    whole = http.post("/v1/chat/completions", json=body)
    assert whole.status_code == 200, whole.text
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as reply:
        assert reply.status_code == 200 and reply.headers["x-ilre-action"] == "compressed"
        events = sse_payloads(reply)
    chunks = [e for e in events if e.get("choices")]
    assert all(e["object"] == "chat.completion.chunk" for e in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in chunks)
    assert text == whole.json()["choices"][0]["message"]["content"]


def test_short_prompts_pass_through_byte_for_byte(relay, http):
    raw = b'{"prompt":   "Hello there,\\u00e9 how are you?" , "n_predict": 3,"temperature":0, "x_extra": {"a": [1, 2.50]}}'
    reply = http.post("/completion", content=raw, headers={"content-type": "application/json"})
    assert reply.status_code == 200
    assert reply.headers["x-ilre-action"] == "passthrough"
    assert relay.last("/completion").body == raw


def test_an_engine_connection_idle_past_its_keep_alive_is_not_reused(engine, relay):
    """Engines close a connection idle for 5 s; one reused at that instant fails with no answer.
    The sidecar drops idle connections well before: a request after a pause gets a fresh one, a
    request soon after reuses it. (Its own sidecar: no health check in between to reuse it.)"""
    with sidecar_service(engine, relay.url, engine_health_interval_s=3600) as svc, \
            httpx.Client(base_url=f"http://127.0.0.1:{svc.http_port}", timeout=60) as client:
        def connection(marker: str) -> int:
            reply = client.post("/tokenize", json={"content": marker})
            assert reply.status_code == 200, reply.text
            return relay.connection_of(marker.encode())
        # "soon": the second request 0.3 s after the first's answer (its connection is back in the pool by then: it
        # returns when the sidecar has closed the engine's reply, a moment after the caller has its answer), well
        # inside the idle limit
        start = time.monotonic()
        first = connection("keep-alive-one")
        time.sleep(0.3)
        second = connection("keep-alive-two")
        took = time.monotonic() - start
        assert took < IDLE_CONNECTION_S and second == first, f"two requests {took:.2f} s apart took two connections"
        time.sleep(IDLE_CONNECTION_S + 1.0)  # still inside the engine's 5 s
        assert connection("keep-alive-three") != first


def test_a_request_on_a_connection_the_engine_just_closed_is_sent_again(engine, llama):
    """llama.cpp's server closes its connection right after each streamed answer, its headers saying
    nothing of it: a request sent on that connection before the close shows fails unanswered (CI saw
    502s). The sidecar sends it again on a new connection. A relay that shows the close 0.5 s late
    makes the race certain."""
    late = RecordingRelay(llama.port, close_delay_s=0.5)
    try:
        with sidecar_service(engine, late.url, engine_health_interval_s=3600) as svc, \
                httpx.Client(base_url=f"http://127.0.0.1:{svc.http_port}", timeout=60) as client:
            def stream() -> None:
                streamed = {"prompt": "Count: 1, 2,", "n_predict": 4, "stream": True, **GREEDY}
                with client.stream("POST", "/completion", json=streamed) as reply:
                    assert reply.status_code == 200 and len(sse_payloads(reply)) > 1
            stream()
            reply = client.post("/completion", json={"prompt": "And after the stream", "n_predict": 2, **GREEDY})
            assert reply.status_code == 200, reply.text
            # on the connection the engine had closed, then on a new one
            assert len(late.connections_with(b"And after the stream")) == 2
            stream()  # a request on another route, without a body, is sent again too
            reply = client.get("/props?after-the-stream")
            assert reply.status_code == 200, reply.text
            assert len(late.connections_with(b"after-the-stream")) == 2
    finally:
        late.close()


def _undated(value):
    """A JSON value without its "created" timestamps (the engine stamps each answer with the second)."""
    if isinstance(value, dict):
        return {k: _undated(v) for k, v in value.items() if k != "created"}
    return [_undated(v) for v in value] if isinstance(value, list) else value


def test_other_paths_reach_the_engine_unchanged(llama, relay, http):
    for path in ("/health", "/v1/models", "/props"):
        via, direct = http.get(path), httpx.get(llama.url + path)
        assert via.status_code == direct.status_code == 200
        assert len(via.headers.get_list("date")) == len(via.headers.get_list("server")) == 1
        assert _undated(via.json()) == _undated(direct.json())
        assert relay.last(path).method == "GET"
    raw = b'{"content": "Hello   world", "add_special": false}'
    via = http.post("/tokenize", content=raw, headers={"content-type": "application/json"})
    assert via.json() == httpx.post(llama.url + "/tokenize", content=raw).json()
    assert relay.last("/tokenize").body == raw
    missing = http.get("/no/such/path")
    assert missing.status_code == httpx.get(llama.url + "/no/such/path").status_code == 404


# -- failures ------------------------------------------------------------------------------------
@pytest.mark.parametrize("body,headers,field", [
    ({"compression": {"budget": 0}}, {}, "compression.budget"),
    ({"compression": {"ratio": 1.5}}, {}, "compression.ratio"),
    ({"compression": {"budget": 8, "ratio": 0.5}}, {}, "compression.budget"),
    ({"compression": {"bogus": 1}}, {}, "compression.bogus"),
    ({"compression": {"strategy": "no-such"}}, {}, "compression.strategy"),
    ({"compression": {"query_tokens": 0}}, {}, "compression.query_tokens"),
    ({"compression": {"granularity": "sentence"}}, {}, "compression.granularity"),
    ({}, {"x-ilre-granularity": "sentence"}, "x-ilre-granularity"),
    ({"compression": "fast"}, {}, "compression"),
    ({}, {"x-ilre-budget": "many"}, "x-ilre-budget"),
    ({}, {"x-ilre-ratio": "0"}, "x-ilre-ratio"),
    ({}, {"x-ilre-compress": "maybe"}, "x-ilre-compress"),
    ({}, {"x-request-timeout": "-1"}, "x-request-timeout"),
])
def test_bad_options_are_400_naming_the_field(relay, http, body, headers, field, caplog):
    relay.clear()
    with caplog.at_level("WARNING", logger="ilre.sidecar"):
        reply = http.post("/completion", json={"prompt": "short", "n_predict": 1, **body}, headers=headers)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == field and error["message"].startswith(f"{field}:")
    assert not [r for r in relay.requests() if r.path == "/completion"]  # nothing reached the engine
    (logged,) = failures(caplog, reply.headers["x-ilre-request-id"])
    assert logged.fields["status"] == 400 and logged.fields["cause"] == error["message"]


def test_granularity_unit_forwards_whole_lines(engine, relay, http):
    text = lines_context()
    ids = engine.tokenizer(text + LINES_QUERY).input_ids
    n_query = len(ids) - len(engine.tokenizer(text).input_ids)
    assert engine.tokenizer.decode(ids[:-n_query]) == text  # the query is exactly the question
    expected = engine.compress(CompressRequest(context_ids=ids[:-n_query], query_ids=ids[-n_query:], budget=60,
                                               granularity="unit"))
    assert expected.granularity == "unit"
    assert_whole_lines(text, expected.kept_spans)
    options = {"budget": 60, "granularity": "unit", "query_tokens": n_query}
    as_headers = {f"x-ilre-{name.replace('_', '-')}": str(value) for name, value in options.items()}
    for body, headers in (({"compression": options}, {}), ({}, as_headers)):
        reply = http.post("/completion", json={"prompt": text + LINES_QUERY, "n_predict": 1, **body}, headers=headers)
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-ilre-action"] == "compressed"
        assert relay.last("/completion").json()["prompt"] == expected.token_ids


def test_strategy_options_are_named_by_their_full_path(http):
    reply = http.post("/completion", json={"prompt": "short", "compression": {"strategy": "ilre",
                                                                             "strategy_options": {"max_kernels": 0}}})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "compression.strategy_options.max_kernels"


def test_engine_down_is_502_naming_the_engine_logged_once_and_not_ready(engine, caplog):
    url = f"http://127.0.0.1:{free_port()}"
    with sidecar_service(engine, url) as svc, httpx.Client(base_url=f"http://127.0.0.1:{svc.http_port}") as client:
        wait_for(lambda: client.get("/ilre/readyz").json()["engine"]["checked_s_ago"] is not None, 30, "a health check")
        ready = client.get("/ilre/readyz")
        assert ready.status_code == 503 and client.get("/ilre/healthz").status_code == 200
        assert ready.json()["model_loaded"] is True and ready.json()["engine"]["healthy"] is False
        assert url in ready.json()["engine"]["cause"]
        with caplog.at_level("WARNING", logger="ilre.sidecar"):
            replies = [client.post("/completion", json={"prompt": "hi", "n_predict": 1}, headers={"x-request-id": "gone-1"}),
                       client.get("/health", headers={"x-request-id": "gone-2"})]
    for rid, route, reply in zip(("gone-1", "gone-2"), ("llamacpp.completion", "other"), replies):
        assert reply.status_code == 502 and reply.headers["x-ilre-request-id"] == rid
        assert url in reply.json()["error"]["message"]
        (logged,) = failures(caplog, rid)
        assert logged.fields == {"request_id": rid, "route": route, "status": 502, "engine_url": url,
                                 "cause": reply.json()["error"]["message"]}
        text, as_json = logging.Formatter(TEXT_FORMAT).format(logged), json.loads(JsonFormatter().format(logged))
        assert text.startswith(f"WARNING ilre.sidecar: 502 {route} request_id={rid} engine={url}: engine: cannot connect")
        assert as_json["level"] == "WARNING" and {k: as_json[k] for k in logged.fields} == logged.fields


def test_engine_slower_than_the_deadline_is_504(engine, llama):
    slow = RecordingRelay(llama.port, answer_delay_s=6.0)  # the engine answers late on any CPU
    try:
        with sidecar_service(engine, slow.url) as svc, \
                httpx.Client(base_url=f"http://127.0.0.1:{svc.http_port}", timeout=60) as http:
            start = time.monotonic()
            reply = http.post("/completion", json={"prompt": "hi", "n_predict": 1}, headers={"x-request-timeout": "1"})
            waited = time.monotonic() - start
    finally:
        slow.close()
    assert reply.status_code == 504 and "deadline" in reply.json()["error"]["message"]
    assert waited < 5  # the sidecar's deadline, not the engine's delay
    wait_idle(llama)


def predicted_tokens(llama: LlamaServer) -> float:
    metrics = httpx.get(llama.url + "/metrics").text
    return float(next(line.split()[-1] for line in metrics.splitlines() if line.startswith("llamacpp:tokens_predicted_total")))


def test_a_client_that_goes_away_mid_stream_cancels_the_engine_request(llama, sidecar):
    wait_idle(llama)
    before = predicted_tokens(llama)
    with httpx.Client(base_url=f"http://127.0.0.1:{sidecar.http_port}", timeout=60) as client:
        with client.stream("POST", "/completion", json={"prompt": "Count to a thousand:", "n_predict": 3000,
                                                        "ignore_eos": True, "stream": True}) as reply:
            lines = reply.iter_lines()
            got = [line for line, _ in zip((x for x in lines if x.startswith("data:")), range(5))]
            assert len(got) == 5
    wait_idle(llama, timeout=120)
    assert predicted_tokens(llama) - before < 3000  # stopped early, not run to n_predict


def test_a_client_that_goes_away_while_waiting_closes_the_engine_request(llama, relay, sidecar):
    """llama-server keeps generating a non-streamed answer whose client has gone (it does so when
    called directly too); SGLang and vLLM abort it. What the sidecar owes: closing the request."""
    wait_idle(llama)
    marker = "Count to five hundred, slowly:"
    with httpx.Client(base_url=f"http://127.0.0.1:{sidecar.http_port}", timeout=1.0) as client:
        assert client.get("/props").status_code == 200  # its engine connection, kept alive, takes the next request
        with pytest.raises(httpx.ReadTimeout):
            client.post("/completion", json={"prompt": marker, "n_predict": 400, "ignore_eos": True})  # ~10 s of work
    connection = wait_for(lambda: relay.connections_with(marker.encode())[-1:], 10, "the request at the engine")[0]
    wait_for(lambda: relay.closed[connection], 10, "the sidecar to close the engine request")
    assert relay.closed_unanswered[connection]  # closed by the sidecar before the engine had answered
    wait_idle(llama, timeout=600)


# -- text forwarding, Redis workers, API keys ----------------------------------------------------
def test_text_forwarding_sends_the_compressed_text(engine, relay, medium_prompt):
    with sidecar_service(engine, relay.url, forward="text") as svc, \
            httpx.Client(base_url=f"http://127.0.0.1:{svc.http_port}", timeout=300) as client:
        reply = client.post("/completion", json={"prompt": medium_prompt, "n_predict": 12, **GREEDY,
                                                 "compression": {"budget": 256}})
        assert reply.status_code == 200 and reply.headers["x-ilre-action"] == "compressed"
        ids = engine.tokenizer(medium_prompt).input_ids
        expected = engine.tokenizer.decode(reference_ids(engine, ids, 64, budget=256))
        assert relay.last("/completion").json()["prompt"] == expected
        assert "7302946" in reply.json()["content"]

        messages = [{"role": "system", "content": haystack(engine.tokenizer, 1500)},
                    {"role": "user", "content": CHAT_QUESTION}]
        reply = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 8, "temperature": 0,
                                                           "compression": {"budget": 256}})
        assert reply.status_code == 200 and reply.json()["object"] == "chat.completion"
        sent = relay.last("/v1/chat/completions").json()["messages"]
        assert sent[1] == messages[1] and len(sent[0]["content"]) < len(messages[0]["content"]) / 3
        assert FACT.strip() in sent[0]["content"]


def test_compression_through_redis_workers_forwards_the_same_ids(shallow_engine, relay, redis_server, medium_prompt):
    """A flow (the queue between the sidecar and the worker): on the shallow calibration (tests/conftest.py)."""
    from .conftest import WorkerThread

    engine = shallow_engine

    body = {"prompt": medium_prompt, "n_predict": 4, "temperature": 0, "compression": {"budget": 256}}
    config = service_config(redis_url=redis_server.url, redis_prefix="sidecar")
    sidecar = SidecarConfig(engine_url=relay.url, engine_api="llamacpp")
    with WorkerThread(engine, config), ServiceThread(config, sidecar=sidecar, tokenizer=engine.tokenizer) as svc:
        reply = httpx.post(f"http://127.0.0.1:{svc.http_port}/completion", json=body, timeout=300)
    assert reply.status_code == 200 and reply.headers["x-ilre-action"] == "compressed"
    ids = engine.tokenizer(medium_prompt).input_ids
    assert relay.last("/completion").json()["prompt"] == reference_ids(engine, ids, 64, budget=256)


def test_api_keys_guard_every_route_but_the_probes(engine, relay, caplog):
    config = service_config({"ILRE_API_KEYS": "k1"})
    sidecar = SidecarConfig(engine_url=relay.url, engine_api="llamacpp")
    with ServiceThread(config, engine, sidecar=sidecar, tokenizer=engine.tokenizer) as svc, \
            httpx.Client(base_url=f"http://127.0.0.1:{svc.http_port}", timeout=60) as client:
        with caplog.at_level("WARNING", logger="ilre.sidecar"):
            refused = client.post("/completion", json={"prompt": "hi", "n_predict": 1})
        assert refused.status_code == 401 and refused.json()["error"]["param"] == "authorization"
        (logged,) = [r for r in caplog.records if r.name == "ilre.sidecar"]
        assert logged.fields["status"] == 401 and logged.fields["route"] == "/completion"
        assert client.get("/v1/models").status_code == 401
        assert client.get("/health").status_code == 200
        wait_for(lambda: client.get("/ilre/readyz").status_code == 200, 30, "the engine's first health check")
        relay.clear()
        ok = client.post("/completion", json={"prompt": "hi", "n_predict": 1}, headers={"authorization": "Bearer k1"})
        assert ok.status_code == 200
        assert relay.last("/completion").headers["authorization"] == "Bearer k1"  # the engine sees it too


def test_a_compressed_request_is_one_trace_with_the_engine_call(shallow_engine, relay, otlp, medium_prompt):
    """(The trace, not the selection: on the shallow calibration, tests/conftest.py.)"""
    from ilre.service.common import tracing

    engine = shallow_engine

    with sidecar_service(engine, relay.url) as svc, httpx.Client(base_url=f"http://127.0.0.1:{svc.http_port}", timeout=300) as http:
        reply = http.post("/completion", json={"prompt": medium_prompt, "n_predict": 4, **GREEDY},
                          headers={"x-request-id": "side-7"})
        tracing.flush()
    assert reply.status_code == 200 and reply.headers["x-ilre-action"] == "compressed"
    assert reply.headers["x-ilre-request-id"] == "side-7"
    wait_for(lambda: otlp.named("ilre.forward"), 30, "the spans")
    (side,) = otlp.named("ilre.sidecar")
    (request,) = [s for s in otlp.named("ilre.request") if s.parent_id == side.span_id]
    (forward,) = [s for s in otlp.named("ilre.forward") if s.parent_id == side.span_id]
    assert request.attributes["ilre.request_id"] == "side-7" and forward.kind == 3  # CLIENT
    assert forward.attributes["http.response.status_code"] == 200 and request.end_ns <= forward.start_ns
    (queue,) = [s for s in otlp.named("ilre.queue") if s.parent_id == request.span_id]
    (compress,) = [s for s in otlp.named("ilre.compress") if s.parent_id == queue.span_id]
    assert {s.name for s in otlp.spans if s.parent_id == compress.span_id} >= {"tokenize", "prefill", "score", "allocate"}



# -- lossless on demand: the retrieve tool answered by the sidecar ---------------------------------------
@pytest.fixture(scope="module")
def tool_calling(engine):
    """(relay, sidecar client) in front of a llama-server whose chat template renders tools (Hermes style:
    `<tool_call>` JSON), so that its grammar constrains each call to the tool's schema."""
    server = LlamaServer(4096, None, "--chat-template-file", "tests/service/chat_templates/qwen2_5.jinja")
    recorder = RecordingRelay(server.port)
    with sidecar_service(engine, recorder.url) as svc, \
            httpx.Client(base_url=f"http://127.0.0.1:{svc.http_port}", timeout=300) as client:
        yield recorder, client
    recorder.close()
    server.stop()


def chat_rounds(relay, since: int) -> list[dict]:
    """The chat requests the engine got after its first `since` ones."""
    return [r.json() for r in relay.requests() if r.path == "/v1/chat/completions"][since:]


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_retrieve_calls_are_answered_from_the_cache_within_the_round_bound(engine, tool_calling, stream):
    """The engine made to call the tool (tool_choice required, and the answer begun with `<tool_call>`: its
    grammar then writes a call whose hash is one the sidecar named): the sidecar answers the call with the
    original from its cache, withdraws the tool after the last round, and the client's answer holds the
    fact that compression had dropped and no trace of the tool."""
    relay, http = tool_calling
    body = agent_step("openai.chat", haystack(engine.tokenizer, 900, "pydoc"), max_tokens=80, temperature=0,
                      tool_choice="required", stream=stream)
    del body["tools"]  # the client's own tools would be offered beside ilre's; here the engine must call ilre's
    body["messages"].append({"role": "assistant", "content": "<tool_call>\n"})  # the answer begun as a call
    since = len(chat_rounds(relay, 0))
    reply = http.post("/v1/chat/completions", json=body, headers={"x-ilre-budget": "40", "x-ilre-retrieve-rounds": "1"})
    assert reply.status_code == 200, reply.text
    rounds = chat_rounds(relay, since)
    assert len(rounds) == 2 and reply.headers["x-ilre-retrieve-calls"] == "1"  # one round of calls, then the bound
    shortened = rounds[0]["messages"][3]["content"]
    assert shortened.startswith("[ilre kept") and "7302946" not in shortened  # compression dropped the fact
    (offered,) = rounds[0]["tools"]
    assert offered["function"]["name"] == "ilre_retrieve" and "stream" not in rounds[0]
    call, answered = rounds[1]["messages"][-2:]
    assert call["tool_calls"][0]["function"]["name"] == "ilre_retrieve"
    assert answered["role"] == "tool" and "7302946" in answered["content"]  # the original, from the cache
    assert "tools" not in rounds[1] and "tool_choice" not in rounds[1]  # the last round: the tool withdrawn
    if stream:
        assert reply.headers["content-type"].startswith("text/event-stream")
        chunks = [e for e in sse_payloads(reply) if e.get("choices")]
        assert {e["object"] for e in chunks} == {"chat.completion.chunk"}
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in chunks)
    else:
        text = reply.json()["choices"][0]["message"]["content"]
    assert "ilre_retrieve" not in reply.text and "[ilre kept" not in reply.text
    assert "7302946" in text, text
