"""The gateway routes (service/transport/gateway.py) on the in-process service: which messages are
compressed and to what budget, the figures, the markers and their hashes, and the retrieve route."""

from __future__ import annotations

import re

import pytest

from .conftest import http_client
from .test_gateway import QUESTION, agent_chat


@pytest.fixture(scope="module")
def http(local_service):
    with http_client(local_service, timeout=300) as client:
        yield client


def test_the_tool_result_is_compressed_for_the_last_question_and_the_rest_passes(http):
    chat, answer = agent_chat(60)
    image = {"role": "user", "content": [{"type": "text", "text": "and this"}, {"type": "image_url", "image_url": {"url": "data:x"}}]}
    messages = chat[:5] + [image] + chat[5:]
    reply = http.post("/v1/compress", json={"messages": messages, "model": "smollm", "budget": 600})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    out = body["messages"]
    assert [m for i, m in enumerate(out) if i != 3] == [m for i, m in enumerate(messages) if i != 3]
    marker = re.match(r'\[ilre kept (\d+) of (\d+) tokens[^\]]*hash "([0-9a-f]{24})"[^\]]*\]\n', out[3]["content"])
    assert marker and int(marker[1]) <= 600 < int(marker[2]) and body["ccr_hashes"] == [marker[3]]
    assert answer in out[3]["content"]  # ranked by the last user message: the asked record kept whole
    assert body["tokens_before"] > int(marker[2]) and body["tokens_saved"] == body["tokens_before"] - body["tokens_after"]
    assert body["compression_ratio"] == pytest.approx(body["tokens_after"] / body["tokens_before"], abs=1e-6)
    assert body["transforms_applied"] == ["ilre:unit"]

    hash_ = marker[3]
    whole = http.get(f"/v1/retrieve/{hash_}").json()
    assert whole["original_content"] == chat[3]["content"] and not whole["compressed"]
    found = http.get(f"/v1/retrieve/{hash_}", params={"query": QUESTION, "budget": "300"}).json()
    assert answer in found["original_content"] and found["returned_tokens"] == 300 and found["compressed"]


def test_a_text_part_beside_an_image_is_compressed_and_the_image_kept(http):
    chat, answer = agent_chat(60)
    image = {"type": "image_url", "image_url": {"url": "data:x"}}
    pasted = {"role": "user", "content": [{"type": "text", "text": chat[3]["content"]}, image]}
    messages = chat[:3] + [pasted] + chat[4:]
    reply = http.post("/v1/compress", json={"messages": messages, "budget": 600})
    assert reply.status_code == 200, reply.text
    out = reply.json()["messages"]
    assert [m for i, m in enumerate(out) if i != 3] == [m for i, m in enumerate(messages) if i != 3]
    text, kept_image = out[3]["content"]
    assert kept_image == image and text["text"].startswith("[ilre kept") and answer in text["text"]


def test_without_a_question_each_message_keeps_its_own_end_and_short_chats_pass(http):
    chat, _ = agent_chat(60)
    tool = chat[3]
    body = http.post("/v1/compress", json={"messages": [tool], "budget": 400}).json()
    content = body["messages"][0]["content"]
    assert content.endswith(tool["content"][-100:]) and int(re.match(r"\[ilre kept (\d+)", content)[1]) <= 400
    short = [{"role": "user", "content": "Hello."}, {"role": "tool", "content": "42"}]
    passed = http.post("/v1/compress", json={"messages": short}).json()
    assert passed["messages"] == short and passed["ccr_hashes"] == [] and passed["tokens_saved"] == 0


def test_bad_gateway_input_is_refused_naming_the_field(http):
    cases = [({"messages": []}, "messages"), ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
             ({"messages": [{"content": "x"}]}, "messages[0]"), ({"messages": [{"role": "user", "content": "x"}], "budget": 0}, "budget"),
             ({"messages": [{"role": "user", "content": "x"}], "granularity": "line"}, "granularity"),
             ({"messages": [{"role": "user", "content": "x"}], "temperature": 1}, "temperature")]
    def refused() -> float:
        lines = http.get("/metrics").text.splitlines()
        return sum(float(l.split()[-1]) for l in lines if l.startswith('ilre_errors_total{code="INVALID_ARGUMENT"}'))

    before = refused()
    for data, field in cases:
        reply = http.post("/v1/compress", json=data)
        assert reply.status_code == 400 and reply.json()["field"] == field, (data, reply.text)
    for path, field, status in (("/v1/retrieve/xyz", "hash", 400), ("/v1/retrieve/" + "a" * 24 + "?budget=-1", "budget", 400),
                                ("/v1/retrieve/" + "a" * 24, "hash", 404)):
        reply = http.get(path)
        assert reply.status_code == status and reply.json()["field"] == field, reply.text
    assert refused() == before + len(cases) + 2  # counted in /metrics as the front end counts its own refusals


def test_a_retrieve_once_the_tool_result_is_deepened_ranks_every_token(http, engine):
    from ilre.contract.messages import CompressRequest

    from tests.engine.test_deepening import deepening_on, uncached

    chat, answer = agent_chat(60)
    coarse = engine.profile.strategy_options("cascade")["coarse_layer"]
    reference = uncached(engine, CompressRequest(context=chat[3]["content"], query=QUESTION, budget=300, granularity="unit",
                                                 strategy="ilre", strategy_options={"also_layers": [coarse]}))
    with deepening_on(engine):
        body = http.post("/v1/compress", json={"messages": chat, "budget": 600}).json()
        assert engine.deepening.wait_idle(120)
        found = http.get(f"/v1/retrieve/{body['ccr_hashes'][0]}", params={"query": QUESTION, "budget": "300"}).json()
        finished = engine.deepening.stats.finished
        states = [list(entry.states) for entry in engine.documents._docs.values() if entry.states]
    assert found["original_content"] == reference["compressed_context"] and answer in found["original_content"]
    # read deep at once (the message's keys, and its whole encoding while it is the conversation's end), not deepened
    # again in the background
    assert finished <= 1 and len(states) == 1 and all(key.startswith(f"l{engine.layer}-") for key in states[0])
