"""A chat compressed message by message (contract/chat.py): the split and the budget's shares against
literal expectations, and the gateway routes and the LiteLLM hook asking for the same compressions of
the same chat (a stand-in model that counts words as tokens; no engine, no LiteLLM proxy)."""

from __future__ import annotations

import asyncio
import copy
import importlib
import importlib.util
import sys
import types
from types import SimpleNamespace
from typing import Any

import pytest

from ilre.contract.chat import (LONG_QUERY, Share, cached_prefix, last_user_index, message_text, query_text,
                                share_budget, split_chat)
from ilre.contract.defaults import QUERY_TOKENS
from ilre.contract.messages import CompressResult

IMAGE = {"type": "image_url", "image_url": {"url": "data:x"}}


def text(parts: list[str]) -> list[dict[str, str]]:
    return [{"type": "text", "text": p} for p in parts]


def words(n: int, tag: str) -> str:
    """n distinct words (tokens, for the stand-in model)."""
    return " ".join(f"{tag}{k}" for k in range(n))


# -- the split ---------------------------------------------------------------------------------------------
def test_a_message_text_is_a_string_or_text_parts_only():
    assert message_text("hi") == "hi" and message_text(text(["a", "b"])) == "ab" and message_text([]) == ""
    assert message_text(text(["a"]) + [IMAGE]) is None and message_text(None) is None and message_text(3) is None
    assert query_text(text(["what is ", "this?"]) + [IMAGE]) == "what is this?"  # the query reads past images
    assert query_text([IMAGE]) is None and query_text("  ") is None and query_text(None) is None


def test_system_and_user():
    split = split_chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}])
    assert (split.texts, split.last_user, split.query) == ({0: "Be brief.", 1: "Why?"}, 1, "Why?")
    assert (split.compressible, split.counted, split.kept, split.by_its_end) == ((), (), (0, 1), True)
    assert split.whole_chat() == "Be brief.\n\nWhy?"
    long = split_chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "x" * (LONG_QUERY + 1)}])
    assert (long.counted, long.kept) == ((1,), (0,))  # more bytes than LONG_QUERY: it may be long, counted alone


def test_multi_turn_compresses_earlier_user_turns_and_keeps_the_model_s_own():
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"},
            {"role": "assistant", "content": "a1"},
            {"role": "developer", "content": "d"}, {"role": "user", "content": text(["u2"])},
            {"role": "assistant", "content": "a2"}, {"role": "user", "content": "u3"}]
    split = split_chat(chat)
    assert (split.last_user, split.query, split.compressible, split.kept) == (6, "u3", (1, 4), (0, 2, 3, 5, 6))
    assert split.counted == (1, 4) and split.joined(split.kept) == "s\n\na1\n\nd\n\na2\n\nu3"


def test_tool_results_and_a_chat_that_ends_with_them():
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "How many rows?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
            {"role": "tool", "tool_call_id": "c1", "content": "rows: 7"}, {"role": "function", "content": "f"},
            {"role": "tool", "tool_call_id": "c2", "content": [IMAGE]}]
    split = split_chat(chat)
    assert last_user_index(chat) == 1 and split.query == "How many rows?"  # the last user message, not the last message
    assert (split.compressible, split.kept, split.counted) == ((3, 4), (0, 1), (3, 4))
    assert 2 not in split.texts and 5 not in split.texts  # no text: as they came


def test_a_last_user_message_with_an_image_asks_but_is_kept_whole():
    chat = [{"role": "user", "content": "the report"}, {"role": "user", "content": text(["and this?"]) + [IMAGE]}]
    split = split_chat(chat)
    assert (split.last_user, split.query, split.by_its_end) == (1, "and this?", False)
    assert (split.compressible, split.counted, split.kept) == ((0,), (0,), (1,)) and split.text(1) == "and this?"


def test_no_user_message_and_empty_messages():
    split = split_chat([{"role": "tool", "content": "x"}, {"role": "user", "content": " "},
                        {"role": "tool", "content": ""}])
    assert (split.last_user, split.query, split.compressible, split.counted, split.kept) == (1, None, (0,), (0,), (1,))
    assert split_chat([{"role": "tool", "content": "x"}]).last_user is None


def test_messages_up_to_a_cache_breakpoint_stay_whole():
    pinned = {"role": "user", "content": [{"type": "text", "text": "doc", "cache_control": {"type": "ephemeral"}}]}
    chat = [{"role": "system", "content": "s"}, {"role": "tool", "content": "t"}, pinned,
            {"role": "tool", "content": "later"}, {"role": "user", "content": "q"}]
    assert cached_prefix(chat) == 3 and cached_prefix(chat[:2]) == 0
    split = split_chat(chat)
    assert split.compressible == (3,) and split.kept == (0, 1, 2, 4)
    whole = split_chat([{"role": "user", "content": "long", "cache_control": {"type": "ephemeral"}}])
    assert not whole.by_its_end  # the pinned last user message is not cut either


# -- the shares --------------------------------------------------------------------------------------------
CHAT = [{"role": "system", "content": "s"}, {"role": "user", "content": "first"},
        {"role": "assistant", "content": None}, {"role": "tool", "content": "rows"}, {"role": "user", "content": "q"}]
TOKENS = {1: 300, 3: 600}  # and 120 kept whole (the system message, the question): 1020 in all


@pytest.mark.parametrize("budget, expected", [
    (420, [Share(1, 300, 100), Share(3, 600, 200)]),  # 120 kept whole, 300 shared 1:2
    (50, [Share(1, 300, 1), Share(3, 600, 1)]),       # less than what stays whole: one token each
    (1020, [Share(1, 300, 300), Share(3, 600, 600)]),  # fits: each passes whole
])
def test_the_budget_is_shared_by_tokens_after_what_stays_whole(budget, expected):
    shares = share_budget(split_chat(CHAT), TOKENS, 120, budget)
    assert shares == expected
    assert all(s.whole for s in shares) == (budget >= 1020)


def test_short_messages_stay_whole_and_count_against_the_budget():
    shares = share_budget(split_chat(CHAT), {1: QUERY_TOKENS, 3: 600}, 120, 420)
    assert shares == [Share(3, 600, 420 - 120 - QUERY_TOKENS)]


def test_a_long_last_user_message_keeps_its_end_and_shares_the_rest():
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "documents " * 50 + "then a question"}]
    assert share_budget(split_chat(chat), {1: LONG_QUERY}, 10, 50) == []  # not long: whole
    (share,) = share_budget(split_chat(chat), {1: 1000}, 10, 300)
    assert share == Share(1, 1000, 300 - 10, by_its_end=True) and share.kept == 290  # 226 shared + its last 64
    many = share_budget(split_chat([{"role": "tool", "content": "t"}] + chat), {0: 200, 2: 1000}, 10, 300)
    room = 300 - 10 - QUERY_TOKENS  # 226, over 200 + 936 tokens
    assert many == [Share(0, 200, room * 200 // 1136), Share(2, 1000, room * 936 // 1136 + QUERY_TOKENS, True)]


# -- the gateway and the hook follow it alike ----------------------------------------------------------------
class WordModel:
    """Stands in for the model behind either caller: a word is a token, text j's IDs are j*10**6 + k, and
    every compression that is not a count is recorded as (text, budget, query)."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.asked: list[tuple[str, int, str]] = []

    def _ids(self, text: str) -> tuple[int, list[int]]:
        if text not in self.texts:
            self.texts.append(text)
        j = self.texts.index(text)
        return j, [j * 10**6 + k for k in range(len(text.split()))]

    def _words(self, ids: list[int]) -> list[str]:
        return [self.texts[i // 10**6].split()[i % 10**6] for i in ids]

    def run_all(self, fields: dict[str, Any]) -> list[CompressResult]:
        """Every result of a request: one per document of `document_ids` (each asked as by its id), else one."""
        if "document_ids" not in fields:
            return [self.run(fields)]
        rest = {k: v for k, v in fields.items() if k not in ("document_ids", "budgets")}
        return [self.run({**rest, "document_id": doc, "budget": budget})
                for doc, budget in zip(fields["document_ids"], fields["budgets"])]

    def run(self, fields: dict[str, Any]) -> CompressResult:
        if "document_id" in fields:
            source = self.texts[int(fields["document_id"], 16)]
            context = source.split()
        elif "context_ids" in fields:
            source, context = self.texts[fields["context_ids"][0] // 10**6], self._words(fields["context_ids"])
        else:
            source, context = fields["context"], fields["context"].split()
        j, ids = self._ids(source)
        query = " ".join(self._words(fields["query_ids"])) if "query_ids" in fields else fields.get("query", "")
        if fields.get("ratio") == 1.0:
            kept = context
        else:
            self.asked.append((source, fields["budget"], query))
            kept = context[:fields["budget"]]
        return CompressResult(id=None, token_ids=ids, kept_indices=list(range(len(kept))),
                              compressed_context=" ".join(kept), query=" " + query, original_tokens=len(context),
                              compressed_tokens=len(kept), ratio=1.0, model="words", layer=1, strategy="ilre", dca=False,
                              passthrough=fields.get("ratio") == 1.0, timings_ms={}, document_id=f"{j:032x}")


@pytest.fixture
def hook_module(monkeypatch):
    """ilre.integrations.litellm, LiteLLM's CustomLogger stood in where LiteLLM is not installed (its
    proxy runs from an environment of its own, .venv-litellm)."""
    stubbed = importlib.util.find_spec("litellm") is None
    if stubbed:
        logger = types.ModuleType("litellm.integrations.custom_logger")
        logger.CustomLogger = type("CustomLogger", (), {"__init__": lambda self, **kwargs: None})
        for name in ("litellm", "litellm.integrations"):
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
        monkeypatch.setitem(sys.modules, "litellm.integrations.custom_logger", logger)
        monkeypatch.delitem(sys.modules, "ilre.integrations.litellm", raising=False)
    yield importlib.import_module("ilre.integrations.litellm")
    if stubbed:
        sys.modules.pop("ilre.integrations.litellm", None)
        import ilre.integrations

        vars(ilre.integrations).pop("litellm", None)


def through_the_hook(module: Any, chat: list[dict], budget: int) -> tuple[WordModel, list[dict], dict[str, str]]:
    model = WordModel()
    hook = module.IlreCompression(budget=budget)
    hook.backend = SimpleNamespace(compress=lambda **fields: model.run(fields))
    data = {"messages": copy.deepcopy(chat)}
    asyncio.run(hook.async_pre_call_hook(None, None, data, "acompletion"))
    return model, data["messages"], data["metadata"]["ilre"]


def through_the_gateway(chat: list[dict], budget: int) -> tuple[WordModel, dict[str, Any]]:
    from ilre.service.transport.gateway import Call, Gateway

    model = WordModel()

    async def compress(fields: dict[str, Any], *args: Any, **kwargs: Any) -> SimpleNamespace:
        return SimpleNamespace(results=model.run_all(fields))

    gateway = Gateway(SimpleNamespace(compress=compress), budget)
    return model, asyncio.run(gateway.compress({"messages": copy.deepcopy(chat), "budget": budget}, Call(None)))


def agent_chat() -> list[dict]:
    return [{"role": "system", "content": words(30, "s")}, {"role": "user", "content": words(200, "u")},
            {"role": "assistant", "content": words(300, "a")},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
            {"role": "tool", "tool_call_id": "c1", "content": words(800, "t")},
            {"role": "user", "content": text([words(20, "q")])},
            {"role": "tool", "tool_call_id": "c2", "content": words(40, "r")}]


def pasted_chat() -> list[dict]:
    return [{"role": "system", "content": words(30, "s")}, {"role": "tool", "content": words(400, "t")},
            {"role": "user", "content": words(1000, "d") + " " + words(20, "q")}]


@pytest.mark.parametrize("make, budget, question, expected", [
    # kept whole: 30 + 300 (system, assistant) + 40 (short tool) + 20 (the question) = 390; 210 shared 200:800
    (agent_chat, 600, words(20, "q"), [(1, 42), (4, 168)]),
    # kept whole: 30 + the pasted message's last 64 (the query); 306 shared 400:956 (that message less its end)
    (pasted_chat, 400, " ".join((words(1000, "d") + " " + words(20, "q")).split()[-QUERY_TOKENS:]),
     [(1, 306 * 400 // 1356), (2, 306 * 956 // 1356)]),
])
def test_the_gateway_and_the_hook_ask_for_the_same_compressions(hook_module, make, budget, question, expected):
    chat = make()
    split = split_chat(chat)
    tokens = {i: len(split.text(i).split()) for i in split.counted}
    shares = share_budget(split, tokens, len(split.joined(split.kept).split()), budget)
    assert [(s.index, s.budget - (QUERY_TOKENS if s.by_its_end else 0)) for s in shares] == expected  # context budgets

    hook, sent, headers = through_the_hook(hook_module, chat, budget)
    gateway, answer = through_the_gateway(chat, budget)
    asked = sorted((split.text(i), size, question) for i, size in expected)  # (context, budget, query)
    assert sorted(hook.asked) == sorted(gateway.asked) == asked
    changed = [i for i, (a, b) in enumerate(zip(sent, chat)) if a != b]
    assert changed == [i for i, m in enumerate(answer["messages"]) if m != chat[i]] == [i for i, _ in expected]
    assert headers["x-ilre-action"] == "compressed" and int(headers["x-ilre-compressed-tokens"]) <= budget
    assert answer["tokens_before"] == int(headers["x-ilre-original-tokens"])
