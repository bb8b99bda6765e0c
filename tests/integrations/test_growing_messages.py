"""A chat message that grew (a streamed tool result, an appended log) takes its cached prefix on through the
gateway route and the LiteLLM hook, each message still a document of its own: the grown message's answer equals
a fresh cache's, and the service counts the tokens taken on (ilre_tokens_resumed_total)."""

from __future__ import annotations

import asyncio
import copy
import re

import httpx

from ilre.engine.documents import DocumentCache
from ilre.evaluation.tasks.haystack import shakespeare_text
from tests.engine.test_chat import hook_module  # noqa: F401 (LiteLLM's base class where LiteLLM is not installed)
from tests.engine.test_growing import resume_at
from tests.service.conftest import local_service  # noqa: F401 (the in-process service on the shared engine)
from tests.shallow import engine_on_shallow_calibration  # noqa: F401 (engine: a flow, on the shallow calibration)


QUESTION = "Which lines speak of the crown?"


def tool_chat(engine, start: int, tokens: int) -> list[dict]:
    """A tool result of `tokens` tokens of Shakespeare from character `start`, then the question."""
    ids = engine.tokenizer(shakespeare_text()[start: start + tokens * 6], add_special_tokens=False).input_ids
    return [{"role": "system", "content": "Answer from the tool results."},
            {"role": "tool", "tool_call_id": "call_1", "content": engine.tokenizer.decode(ids[:tokens])},
            {"role": "user", "content": QUESTION}]


def grown(chat: list[dict], engine, tokens: int) -> list[dict]:
    """The same chat whose tool result has `tokens` more tokens appended (a log that went on)."""
    more = tool_chat(engine, 200_000, tokens)[1]["content"]
    longer = copy.deepcopy(chat)
    longer[1]["content"] += "\n" + more
    return longer


def resumed_total(url: str) -> float:
    return float(re.search(r"^ilre_tokens_resumed_total (\S+)$", httpx.get(url + "/metrics").text, re.M).group(1))


def after_and_fresh(engine, url: str, ask, chat: list[dict], longer: list[dict]) -> tuple[object, object, float]:
    """(the grown chat's answer after the first chat's, its answer on a fresh cache, tokens taken on between)."""
    kept = engine.documents
    engine.documents = DocumentCache(1 << 30)
    try:
        ask(chat)
        before = resumed_total(url)
        after = ask(longer)
        taken_on = resumed_total(url) - before
        engine.documents = DocumentCache(1 << 30)
        return after, ask(longer), taken_on
    finally:
        engine.documents = kept


def test_a_grown_message_resumes_through_the_gateway(engine, local_service):  # noqa: F811
    url = f"http://127.0.0.1:{local_service.http_port}"

    def ask(messages: list[dict]) -> dict:
        reply = httpx.post(url + "/v1/compress", json={"messages": messages, "budget": 300}, timeout=300)
        assert reply.status_code == 200, reply.text
        return reply.json()

    chat = tool_chat(engine, 0, 1500)
    after, fresh, taken_on = after_and_fresh(engine, url, ask, chat, grown(chat, engine, 400))
    assert after == fresh and after["tokens_before"] > after["tokens_after"]
    assert taken_on == resume_at(len(engine.tokenizer(chat[1]["content"]).input_ids))  # its first chunk


def test_a_grown_message_resumes_through_the_litellm_hook(engine, local_service, hook_module):  # noqa: F811
    url = f"http://127.0.0.1:{local_service.http_port}"
    hook = hook_module.IlreCompression(target=url, budget=300)

    def ask(messages: list[dict]) -> list[dict]:
        data = {"messages": copy.deepcopy(messages)}
        asyncio.run(hook.async_pre_call_hook(None, None, data, "acompletion"))
        assert data["metadata"]["ilre"]["x-ilre-action"] == "compressed", data["metadata"]
        return data["messages"]

    chat = tool_chat(engine, 50_000, 2600)  # ends inside its third chunk: two are taken on
    after, fresh, taken_on = after_and_fresh(engine, url, ask, chat, grown(chat, engine, 300))
    assert after == fresh and after[1]["content"] != chat[1]["content"]
    assert taken_on == resume_at(len(engine.tokenizer(chat[1]["content"]).input_ids))  # its first two chunks
