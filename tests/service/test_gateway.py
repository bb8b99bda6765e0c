"""ilre behind a gateway by URL alone: LiteLLM's real proxy (`make litellm`) with its `headroom` guardrail
pointed at a real `ilre serve` (config.yaml only: no ilre hook, no ilre setting), in front of llama.cpp's
server (a 4096-token window); the retrieve route as the proxy calls it; ilre stopped under fail_closed
and fail_open (two models, a guardrail each). The gateway routes' input checks are fuzzed with the rest of
the HTTP API (test_fuzz.py)."""

from __future__ import annotations

import json
import random
import re

import httpx
import pytest

from .conftest import served_by
from .engines import RecordingRelay
from tests.integrations.test_litellm import Proxy, direct, engine  # noqa: F401 (engine: llama.cpp's server, a 4096-token window)

KEYS = {"alice": "sk-alice-0d9e3b7a51", "bob": "sk-bob-6c2f18e4a0"}
QUESTION = "How many rows did the job gentle-harbor write?"
HEADROOM = """  - guardrail_name: {name}
    litellm_params:
      guardrail: headroom
      mode: pre_call
      api_base: {url}
      api_key: {key}
      unreachable_fallback: {fallback}
"""
# Two models on one proxy (one LiteLLM start is ~17 s of CPU), each with its own `headroom` guardrail (model-level):
# "smollm" through ilre, refusing calls while ilre is unreachable; "smollm-open" letting them through.
GUARDRAILS = {"smollm": "ilre", "smollm-open": "ilre-open"}


def tool_output(records: int, seed: int = 0) -> tuple[str, str]:
    """(a list_jobs tool's pretty-printed JSON output, the asked record's rows_written)."""
    rng = random.Random(seed)
    jobs = [{"job": f"job-{n:04d}", "status": rng.choice(["done", "failed", "running"]), "owner": rng.choice(["ana", "bo"]),
             "rows_read": rng.randrange(10**6, 10**7), "rows_written": rng.randrange(10**6, 10**7)} for n in range(records)]
    asked = jobs[records * 2 // 3]
    asked["job"] = "gentle-harbor"
    return json.dumps({"results": jobs, "count": records}, indent=2), str(asked["rows_written"])


def agent_chat(records: int) -> tuple[list[dict], str]:
    """An agent's chat whose earlier tool result holds the answer to the last question. (`headroom` never
    sends the system messages, the last user and assistant messages, nor the tool exchange of the last
    assistant message.)"""
    output, answer = tool_output(records)
    return [{"role": "system", "content": "You answer from the tool results."},
            {"role": "user", "content": "List the jobs of the warehouse."},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "list_jobs", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": output},
            {"role": "assistant", "content": f"The warehouse has {records} jobs."},
            {"role": "user", "content": QUESTION}], answer


def retrieve(served, hash_: str, key: str, **params: str) -> httpx.Response:
    return httpx.get(f"{served.http}/v1/retrieve/{hash_}", params=params, timeout=300,
                     headers={"authorization": f"Bearer {key}"})


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gateway-keys") / "keys.txt"
    path.write_text("".join(f"{key} name={name}\n" for name, key in KEYS.items()))
    return str(path)


def test_headroom_guardrail_reaches_ilre_by_url_the_model_takes_back_what_was_cut_and_ilre_stopped_fails_closed_or_open(
        engine, keys_file, tmp_path):
    chat, answer = agent_chat(110)  # ~5K tokens, nearly all in the tool result
    tool = chat[3]["content"]
    refused = direct(engine, chat)
    assert refused.status_code == 400 and "context" in refused.text  # the engine cannot take it whole
    relay = RecordingRelay(engine.port)
    proxy = None
    try:
        with served_by("--budget", "1024", "--api-keys-file", keys_file) as served:
            plugs = "guardrails:\n" + HEADROOM.format(name="ilre", url=served.http, key=KEYS["alice"], fallback="fail_closed") \
                + HEADROOM.format(name="ilre-open", url=served.http, key=KEYS["alice"], fallback="fail_open")
            proxy = Proxy(relay, tmp_path, plugs=plugs, args=("--detailed_debug",), guardrails=GUARDRAILS)
            reply = proxy.chat(chat, max_tokens=24)
            assert reply.status_code == 200, reply.text
            first = next(r for r in relay.requests() if r.path.startswith("/v1/chat/completions")).json()
            sent = first["messages"]
            assert [m["role"] for m in sent] == [m["role"] for m in chat]
            assert all(sent[i].get("content") == chat[i]["content"] for i in (0, 1, 2, 4, 5))  # only the tool result changed
            marker = re.match(r'\[ilre kept (\d+) of (\d+) tokens .*hash "([0-9a-f]{24})"', sent[3]["content"])
            assert marker, sent[3]["content"][:300]
            kept, original, hash_ = int(marker[1]), int(marker[2]), marker[3]
            assert original > engine.ctx_size and kept <= 1024
            assert any(t["function"]["name"] == "headroom_retrieve" for t in first["tools"])
            saved = re.search(r"Headroom: compressed (\d+) tokens -> (\d+) tokens", proxy.log.read_text())
            assert saved and int(saved[1]) > original > int(saved[2]), saved  # LiteLLM logs what was saved

            # the retrieve call, as the proxy makes it for the model's headroom_retrieve(hash, query)
            found = retrieve(served, hash_, KEYS["alice"], query=QUESTION)
            assert found.status_code == 200, found.text
            body = found.json()
            assert answer in body["original_content"] and body["returned_tokens"] <= 1024 and body["compressed"]
            whole = retrieve(served, hash_, KEYS["alice"])
            assert whole.status_code == 200 and whole.json()["original_content"] == tool
            other = retrieve(served, hash_, KEYS["bob"], query=QUESTION)  # another key's hash: as if never made
            assert other.status_code == 404 and other.json()["field"] == "hash"
            assert retrieve(served, "0" * 24, KEYS["alice"]).json() == {**other.json()}
            bad = retrieve(served, hash_[:20], KEYS["alice"])
            assert bad.status_code == 400 and bad.json()["field"] == "hash"

            loop = [r.json() for r in relay.requests() if r.path.startswith("/v1/chat/completions")][1:]
            retrieved = [m for r in loop for m in r["messages"] if m["role"] == "tool" and m.get("tool_call_id") != "call_1"]
            print(f"agentic loop: {len(loop)} follow-up call(s); retrieved: {[m['content'][:80] for m in retrieved]}")
            for message in retrieved:  # the model called headroom_retrieve: ilre answered through the proxy
                assert not message["content"].startswith("[Headroom:"), message["content"][:200]

        stopped = proxy.chat(chat)  # ilre is gone: fail_closed refuses the call
        assert stopped.status_code >= 500 and "Headroom" in stopped.text, stopped.text[:500]
        short, _ = agent_chat(40)  # ~2K tokens: within the engine's window
        reply = proxy.chat(short, model="smollm-open")  # fail_open lets it through, as it came
        assert reply.status_code == 200, reply.text
        assert relay.last("/v1/chat/completions").json()["messages"][3]["content"] == short[3]["content"]
    finally:
        if proxy is not None:
            proxy.stop()
        relay.close()
