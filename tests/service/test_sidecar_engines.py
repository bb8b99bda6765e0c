"""The sidecar in front of the engines its users run: a real vLLM OpenAI server and a real SGLang
server (both on this CPU, serving the embedded model with a 4096-token window), each behind a
recording relay so that every test reads exactly what the engine received. One engine runs at a
time, started once for the module (the last test takes it away and back at its relay, not by a restart)."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from ilre.service.common.config import SidecarConfig
from ilre.service.server import ServiceThread

from .conftest import service_config, wait_for
from .engines import RecordingRelay, SGLangServer, VllmServer, wait_idle
from .agent_steps import (APIS, STREAM_EVENTS, agent_step, answer_text, assert_only_the_tool_output_changed,
                          prompt_tokens, streamed_text)
from .haystacks import FACT, haystack, over_the_window, reference_ids

pytestmark = pytest.mark.slow

WINDOW = 4096
CODE = "7302946"
ENGINES = {"vllm": (VllmServer, "openai"), "sglang": (SGLangServer, "sglang")}
AGENT_APIS = {"vllm": ("openai.chat", "openai.responses", "anthropic.messages"), "sglang": ("openai.chat",)}
TOOL_CALLS = {"vllm": ("--enable-auto-tool-choice", "--tool-call-parser", "hermes"),  # `tools` with tool_choice auto
              "sglang": ("--tool-call-parser", "qwen25")}
FAST_START = {"vllm": (), "sglang": ("--skip-server-warmup",)}  # SGLang's own warm-up request: 7 s of a 52-s start


@pytest.fixture(scope="module", params=sorted(ENGINES))
def served(request):
    """(engine name, the running engine)."""
    server_class, _ = ENGINES[request.param]
    server = server_class(WINDOW, *TOOL_CALLS[request.param], *FAST_START[request.param]).start()
    print(f"\n{request.param}: ready in {server.start_s:.1f} s")
    yield request.param, server
    server.stop()


@pytest.fixture(scope="module")
def relay(served):
    recorder = RecordingRelay(served[1].port)
    yield recorder
    recorder.close()


def sidecar_for(engine, served, url: str, **settings) -> ServiceThread:
    config = SidecarConfig(engine_url=url, engine_api=ENGINES[served[0]][1], engine_health_interval_s=0.5, **settings)
    return ServiceThread(service_config(), engine, sidecar=config, tokenizer=engine.tokenizer)


@pytest.fixture(scope="module")
def http(engine, served, relay):
    with sidecar_for(engine, served, relay.url) as svc, \
            httpx.Client(base_url=f"http://127.0.0.1:{svc.http_port}", timeout=600) as client:
        yield client


@pytest.fixture(scope="module")
def long_prompt(engine):
    return over_the_window(engine.tokenizer)


@pytest.fixture(scope="module")
def expected(engine, long_prompt):
    """What `ilre compress` keeps of the long prompt (query = its last 64 tokens, budget 1024)."""
    return reference_ids(engine, engine.tokenizer(long_prompt).input_ids, 64)


def events(reply: httpx.Response) -> list[dict]:
    """The JSON payloads of an SSE answer, [DONE] left out."""
    return [json.loads(line[5:]) for line in reply.iter_lines() if line.startswith("data:") and line[5:].strip() != "[DONE]"]


def completion_body(served, prompt, **extra) -> dict:
    return {"model": "smollm2", "prompt": prompt, "max_tokens": 12, "temperature": 0, **extra}


# -- the long prompt: refused whole, answered through the sidecar -------------------------------------
def test_the_engine_refuses_the_whole_prompt_and_the_sidecar_relays_that(served, http, long_prompt):
    server = served[1]
    direct = httpx.post(server.url + "/v1/completions", json=completion_body(served, long_prompt), timeout=120)
    via = http.post("/v1/completions", json=completion_body(served, long_prompt), headers={"x-ilre-compress": "off"})
    assert direct.status_code == via.status_code == 400, (direct.text, via.text)
    assert via.json() == direct.json() or via.json()["error"]["message"] == direct.json()["error"]["message"]
    assert via.headers["x-ilre-action"] == "off"


def test_completions_text_and_token_ids_streamed_and_not(engine, served, relay, http, long_prompt, expected):
    reply = http.post("/v1/completions", json=completion_body(served, long_prompt))
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-ilre-action"] == "compressed"
    assert int(reply.headers["x-ilre-compressed-tokens"]) == len(expected) == 1024 + 64
    sent = relay.last("/v1/completions").json()
    assert sent["prompt"] == expected and sent["max_tokens"] == 12  # IDs on the wire, the rest untouched
    assert reply.json()["usage"]["prompt_tokens"] == len(expected)
    assert CODE in reply.json()["choices"][0]["text"]

    ids = engine.tokenizer(long_prompt).input_ids
    body = completion_body(served, ids, stream=True, stream_options={"include_usage": True})
    with http.stream("POST", "/v1/completions", json=body) as streamed:
        assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
        chunks = events(streamed)
    assert relay.last("/v1/completions").json()["prompt"] == expected
    assert CODE in "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
    assert chunks[-1]["usage"]["prompt_tokens"] == len(expected)


@pytest.fixture(scope="module")
def tool_output(engine):
    """~12,000 tokens of Python's reference text with the fact planted: three times the engine's window (the
    document cache encodes it once for every API's step)."""
    return haystack(engine.tokenizer, 12000, "pydoc")


@pytest.mark.parametrize("api", sorted(APIS))
def test_an_agent_step_on_each_api_is_compressed_and_answered_in_its_shape(served, relay, http, tool_output, api):
    """One agent step (a tool call and its ~12K-token result) on every conversation API the engine serves:
    refused whole by the engine, answered through the sidecar with only the tool result compressed."""
    name, server = served
    if api not in AGENT_APIS[name]:
        pytest.skip(f"{name} does not serve {APIS[api]}")
    limit = {"openai.chat": "max_tokens", "openai.responses": "max_output_tokens", "anthropic.messages": "max_tokens"}[api]
    body = agent_step(api, tool_output, temperature=0, **{limit: 24})
    direct = httpx.post(server.url + APIS[api], json=body, timeout=120)
    assert direct.status_code == 400, direct.text[:300]  # whole, it exceeds the window

    reply = http.post(APIS[api], json=body)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-ilre-action"] == "compressed"
    kept = assert_only_the_tool_output_changed(api, relay.last(APIS[api]).json(), body)
    assert FACT.strip() in kept
    answer = reply.json()
    print(f"{name} {api}: {answer_text(api, answer)!r}")
    empty = httpx.post(server.url + APIS[api], json=agent_step(api, "", **{limit: 1}), timeout=120).json()
    assert prompt_tokens(api, answer) <= 1024 + prompt_tokens(api, empty)  # the budget + what stays whole

    with http.stream("POST", APIS[api], json={**body, "stream": True}) as streamed:
        assert streamed.status_code == 200 and streamed.headers["x-ilre-action"] == "compressed"
        chunks = events(streamed)
    kinds = {c.get("object") or c.get("type") for c in chunks}
    assert STREAM_EVENTS[api] in kinds, kinds
    assert streamed_text(api, chunks) == answer_text(api, answer)  # greedy: the same answer, as the API's events


def test_sglang_generate_text_and_input_ids_streamed_and_not(engine, served, relay, http, long_prompt, expected):
    if served[0] != "sglang":
        pytest.skip("/generate is SGLang's own route")
    params = {"max_new_tokens": 12, "temperature": 0.0}
    reply = http.post("/generate", json={"text": long_prompt, "sampling_params": params})
    assert reply.status_code == 200, reply.text
    assert relay.last("/generate").json() == {"input_ids": expected, "sampling_params": params}
    assert reply.json()["meta_info"]["prompt_tokens"] == len(expected)
    assert CODE in reply.json()["text"]

    ids = engine.tokenizer(long_prompt).input_ids
    with http.stream("POST", "/generate", json={"input_ids": ids, "sampling_params": params, "stream": True}) as streamed:
        assert streamed.status_code == 200
        chunks = events(streamed)
    assert relay.last("/generate").json()["input_ids"] == expected
    assert len(chunks) > 2 and CODE in chunks[-1]["text"]  # SGLang streams the text so far, event by event
    assert chunks[-1]["meta_info"]["prompt_tokens"] == len(expected)


# -- what passes through, how the sidecar settles on IDs --------------------------------------------
def test_a_short_prompt_passes_through_byte_for_byte(served, relay, http):
    raw = (b'{"model": "smollm2",  "prompt": "Hello there,\\u00e9 how are you?" , "max_tokens": 3,'
           b'"temperature":0, "user": "x-1"}')
    reply = http.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-ilre-action"] == "passthrough"
    assert relay.last("/v1/completions").body == raw
    assert len(reply.headers.get_list("date")) == len(reply.headers.get_list("server")) == 1


def test_forward_auto_settled_on_ids_through_tokenize_and_text_also_works(engine, served, relay, http, long_prompt,
                                                                          expected):
    if not any(r.path == "/tokenize" for r in relay.requests()):  # run alone or first: a compressed request decides
        reply = http.post("/v1/completions", json=completion_body(served, long_prompt))
        assert reply.status_code == 200 and reply.headers["x-ilre-action"] == "compressed", reply.text
    probes = [r for r in relay.requests() if r.path == "/tokenize"]
    assert probes, "the sidecar never asked the engine's /tokenize"
    assert probes[0].json()["prompt"].startswith("Tokenizer probe")
    with sidecar_for(engine, served, relay.url, forward="text") as svc:
        reply = httpx.post(f"http://127.0.0.1:{svc.http_port}/v1/completions", timeout=600,
                           json=completion_body(served, long_prompt))
    assert reply.status_code == 200 and reply.headers["x-ilre-action"] == "compressed"
    assert relay.last("/v1/completions").json()["prompt"] == engine.tokenizer.decode(expected)
    assert CODE in reply.json()["choices"][0]["text"]


# -- a client that goes away; the engine that goes away ------------------------------------------------
def test_a_client_gone_mid_stream_frees_the_engine(served, http):
    _, server = served
    wait_idle(server)
    body = completion_body(served, "Count from one to one thousand:", max_tokens=3000, ignore_eos=True, stream=True)
    with http.stream("POST", "/v1/completions", json=body) as streamed:
        data = (line for line in streamed.iter_lines() if line.startswith("data:"))
        assert len([line for line, _ in zip(data, range(5))]) == 5
        # bounds, not timings: on a loaded 2-core machine the engine's HTTP side can stall for seconds
        wait_for(lambda: server.running_now() == 1, 60, f"{server.name} to report the request running", interval=0.2)
    left = time.monotonic()
    wait_for(lambda: server.running_now() == 0, 60, f"{server.name} to drop the request of the client that left",
             interval=0.2)
    # a metrics call can take long on a starved engine: the bound holds on the whole wait (3,000 tokens take minutes)
    assert time.monotonic() - left < 90, f"{server.name} went on with the request of the client that left"


def test_the_engine_gone_is_502_and_back_it_is_used_again(served, relay, http, caplog):
    """The engine unreachable (its port refusing, its connections closed) and then reachable again: the
    sidecar reports it down, answers 502, and uses it again once back."""
    name, server = served
    wait_for(lambda: http.get("/ilre/readyz").status_code == 200, 30, "/ilre/readyz to see the engine up")
    relay.down()
    wait_for(lambda: http.get("/ilre/readyz").status_code == 503, 10, "/ilre/readyz to report the engine down")
    ready = http.get("/ilre/readyz").json()
    assert ready["model_loaded"] is True and ready["engine"]["healthy"] is False
    assert http.get("/ilre/healthz").status_code == 200  # the sidecar itself lives on

    with caplog.at_level("WARNING", logger="ilre.sidecar"):
        down = http.post("/v1/completions", json=completion_body(served, "Hello"), headers={"x-request-id": f"down-{name}"})
    assert down.status_code == 502 and "error" in down.json()
    (logged,) = [r for r in caplog.records if r.name == "ilre.sidecar" and f"down-{name}" in r.getMessage()]
    assert logged.fields["status"] == 502 and logged.fields["route"] == "openai.completions"
    assert logged.fields["engine_url"] == relay.url and logged.fields["cause"] == down.json()["error"]["message"]

    relay.up()
    wait_for(lambda: http.get("/ilre/readyz").status_code == 200, 15, "/ilre/readyz to see the engine back")
    again = http.post("/v1/completions", json=completion_body(served, "The capital of France is"))
    assert again.status_code == 200 and again.json()["choices"][0]["text"].strip()
