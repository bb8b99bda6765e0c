"""A conversation compressed message by message on the real model (the path the gateway and the sidecar
share): what a tool result keeps, and history mode "frozen" sending every message as it was first sent."""

from __future__ import annotations

import asyncio

import pytest

from ilre.contract.messages import CompressRequest
from ilre.service.sidecar.history import FrozenTexts
from ilre.service.transport.chat_compression import compress_chat

from .agent_steps import agent_step
from .haystacks import CHAT_QUESTION, FACT, haystack
from tests.shallow import engine_on_shallow_calibration  # noqa: F401 (engine: a flow, on the shallow calibration)


def run(engine, messages, budget, frozen=None, together=False):
    asked = []

    async def call_all(fields):
        asked.append(fields)
        return await asyncio.to_thread(lambda: engine.run(CompressRequest.from_json(fields)).results)

    async def call(fields):
        return (await call_all(fields))[0]

    done = asyncio.run(compress_chat(call, messages, lambda _: budget, fields={"granularity": "unit"}, frozen=frozen,
                                     call_many=call_all if together else None))
    return (done, asked) if together else done


@pytest.fixture(scope="module")
def steps(engine):
    """Two agent steps: the second adds a call, another tool result and a new question."""
    first = agent_step("openai.chat", haystack(engine.tokenizer, 1500, "pydoc"))["messages"]
    second = first + [{"role": "assistant", "content": None, "tool_calls": [
                          {"id": "call_2", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
                      {"role": "tool", "tool_call_id": "call_2", "content": haystack(engine.tokenizer, 1500)},
                      {"role": "user", "content": "Which play is this from?"}]
    return first, second


def test_a_tool_result_is_compressed_to_its_share_for_the_question(engine, steps):
    first, _ = steps
    done = run(engine, first, 600)
    (result,) = done.compressed
    assert result.index == 3 and FACT.strip() in result.text
    assert result.before > 1500 and result.after <= 600 and done.after <= 600 < done.before


def test_the_messages_ranked_by_the_question_are_asked_together(engine, steps):
    """With a caller that takes several results (the sidecar's, the gateway's), both tool results go in one request
    by their document_ids: each within its share, the planted fact kept, as one by one."""
    _, second = steps
    second = second[:-1] + [{"role": "user", "content": CHAT_QUESTION}]  # the first result's fact asked again
    alone = run(engine, second, 1200)
    together, asked = run(engine, second, 1200, together=True)
    (one,) = [fields for fields in asked if "document_ids" in fields]
    assert len(one["document_ids"]) == len(one["budgets"]) == 2 and one["query"] == CHAT_QUESTION
    assert [c.index for c in together.compressed] == [c.index for c in alone.compressed] == [3, 6]
    assert all(c.after <= b for c, b in zip(together.compressed, one["budgets"]))
    assert FACT.strip() in together.compressed[0].text and FACT.strip() in alone.compressed[0].text
    assert together.compressed[1] == alone.compressed[1]  # the conversation's end: scored exactly as alone
    assert together.after <= 1200


def test_a_message_whose_document_left_the_cache_is_sent_as_text(steps):
    """With no document cache (every document gone as soon as it is counted), each message is compressed
    from its text: the same kept text as through the cache."""
    from ilre.engine.engine import Engine, EngineConfig

    first, _ = steps
    uncached = Engine(EngineConfig(dtype="float32", doc_cache_mb=0))
    (result,) = run(uncached, first, 600).compressed
    assert result.index == 3 and FACT.strip() in result.text and result.after <= 600


def test_frozen_history_sends_each_message_as_it_was_first_sent(engine, steps):
    first, second = steps
    frozen = FrozenTexts(1 << 20)
    sent_first = {c.index: c.text for c in run(engine, first, 600, frozen).compressed}
    assert set(sent_first) == {3}

    fresh = {c.index: c for c in run(engine, second, 600).compressed}
    again = {c.index: c for c in run(engine, second, 600, frozen).compressed}
    assert fresh[3].text != sent_first[3]  # fresh: compressed again, for the new question and a smaller share
    assert again[3].text == sent_first[3]  # frozen: the very text sent before
    assert set(again) == {3, 6} and again[6].after <= 600  # the budget covers what the step adds
    # every user message and tool result is frozen, whole or compressed: the task, both results, both questions
    assert len(frozen) == 5


def test_frozen_texts_are_bounded_in_bytes_least_recently_used_out_first():
    texts = FrozenTexts(1000)
    texts["a"] = ("x" * 300, 10)
    texts["b"] = ("y" * 300, 10)
    assert texts["a"][1] == 10  # a is now the most recently used
    texts["c"] = ("z" * 300, 10)
    assert "b" not in texts and "a" in texts and "c" in texts and texts.bytes <= 1000
    texts["huge"] = ("w" * 2000, 1)
    assert "huge" not in texts and len(texts) == 2
