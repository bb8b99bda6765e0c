"""A chat compressed message by message through the front end: the one path the gateway routes and the
sidecar's conversation routes take, so a message is compressed the same way whichever door it came
through. contract/chat.py says which messages are compressed, to what share of the budget, and what they
are ranked by; contract/conversation.py reads each API's body as those messages.

Each compressed message is a document of its own in the caller's scope: counted (and cached) whole
first, then asked by its document_id. Where the caller can send one request of several results
(`call_many`), the messages ranked by the live question are asked together, by their document_ids in one
request: the question runs once, after the conversation's end, and is moved to each message
(engine/shared_questions.py), so each message's encoding is its keys alone and a step costs one question's
pass however long the history. The next request that carries the same message (an agent's next step, a
question asked again) finds its encoding cached.

With a `frozen` map (the sidecar's history mode "frozen"), the decision taken for a message the first
time it is seen is final: a later request carrying it gets the very text sent then (compressed for the
question of that time, or whole), so the prompt before the live messages is the same bytes step after
step and the engine's prefix cache holds. The budget then covers what the request adds: the messages
not seen before and those kept whole; the frozen ones are sent as they were, outside it (the prompt
grows by what each step adds, after compression: a `ratio` keeps that in proportion).
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, MutableMapping, Sequence

from ...contract.chat import ChatSplit, Share, is_long_query, share_budget, split_chat
from ...contract.defaults import QUERY_TOKENS
from ...contract.document_ids import retrieve_hash
from ...contract.messages import CompressResult, NotFoundError
from ..common.errors import Code, ServiceError

Call = Callable[[dict[str, Any]], Awaitable[CompressResult]]  # one contract request through the front end
CallMany = Callable[[dict[str, Any]], Awaitable[list[CompressResult]]]  # one request of several results (document_ids)
Frozen = MutableMapping[str, tuple[str, int]]  # document_id -> (the text sent for it, its tokens)


@dataclass(frozen=True)
class Compressed:
    """One compressed message: its index, the text it keeps, its tokens before and after, the document
    its original is cached as."""

    index: int
    text: str
    before: int
    after: int
    document_id: str

    @property
    def hash(self) -> str:
        """The retrieve hash of its original (GET /v1/retrieve/{hash}, the sidecar's retrieve tool)."""
        return retrieve_hash(self.document_id)


@dataclass(frozen=True)
class ChatCompression:
    """What compressing a chat did: the compressed messages (ascending), the tokens of every text
    message before, and the budget applied."""

    compressed: list[Compressed]
    before: int
    budget: int
    originals: dict[int, CompressResult] = field(default_factory=dict)  # each counted message, whole
    query: str | None = None  # the live question's text (None: the chat has none)

    @property
    def after(self) -> int:
        """The text messages' tokens after compression."""
        return self.before - sum(c.before - c.after for c in self.compressed)


def whole(text: str) -> dict[str, Any]:
    """The pass-through request of `text`: its tokens counted and its document cached, nothing computed."""
    return {"context": text, "query": ".", "ratio": 1.0}


async def count_tokens(call: Call, text: str) -> int:
    """The model's tokens in `text` (a pass-through request: tokenized, nothing computed)."""
    return (await call(whole(text))).original_tokens if text else 0


async def compress_chat(call: Call, messages: Sequence[Any], budget_for: Callable[[int], int],
                        query: str | None = None, fields: dict[str, Any] | None = None,
                        frozen: Frozen | None = None, call_many: CallMany | None = None) -> ChatCompression:
    """Compress `messages` (OpenAI-shaped: {"role", "content"}) by contract/chat.py's rules.

    budget_for: the budget (tokens of all text messages after compression) for a chat of that many
    tokens; query: what to rank by (None: the last user message, or each message's own end when there
    is none); fields: request fields every compression takes (granularity, strategy, ...); frozen: the
    texts sent for messages seen before, read and written (see the module docstring); call_many: where given, the
    messages ranked by the question are asked in one request (see the module docstring), else one by one."""
    split = split_chat(messages)
    counted = split.counted
    if frozen is not None and split.last_user in split.texts and split.last_user not in counted:
        counted = tuple(sorted(counted + (split.last_user,)))  # the question of now: sent whole, then frozen
        split = dataclasses.replace(split, counted=counted, kept=tuple(i for i in split.kept if i != split.last_user))
    *counts, rest = await asyncio.gather(*(call(whole(split.text(i))) for i in counted),
                                         count_tokens(call, split.joined(split.kept)))
    originals = dict(zip(counted, counts))
    before = sum(w.original_tokens for w in originals.values()) + rest
    fixed = {i: frozen[w.document_id] for i, w in originals.items() if w.document_id in frozen} if frozen is not None else {}
    live = dataclasses.replace(split, compressible=tuple(i for i in split.compressible if i not in fixed),
                               counted=tuple(i for i in counted if i not in fixed),
                               by_its_end=split.by_its_end and split.last_user not in fixed)
    budget = budget_for(before - sum(originals[i].original_tokens for i in fixed))  # frozen texts are outside it
    shares = share_budget(live, {i: w.original_tokens for i, w in originals.items()}, rest, budget)
    question = _question(split, originals, query)
    extra = fields or {}

    async def one(share: Share) -> Compressed:
        full = originals[share.index]
        if question and not share.by_its_end:
            asked = {**question, "budget": share.budget, **extra}
            try:
                short = await call({"document_id": full.document_id, **asked})
            except (ServiceError, NotFoundError) as exc:  # its IDs left the cache since it was counted (a flood)
                if isinstance(exc, ServiceError) and exc.code is not Code.NOT_FOUND:
                    raise
                short = await call({"context": split.text(share.index), **asked})
            text, kept = short.compressed_context, short.compressed_tokens
        else:  # the long last user message, or no question: its own last QUERY_TOKENS tokens are the
            # query, and stay (within the share)
            ids = full.token_ids[:full.original_tokens]
            short = await call({"context_ids": ids[:-QUERY_TOKENS], "query_ids": ids[-QUERY_TOKENS:],
                                "budget": max(1, share.budget - QUERY_TOKENS), **extra})
            text, kept = short.compressed_context + short.query, short.compressed_tokens + QUERY_TOKENS
        return Compressed(share.index, text, full.original_tokens, kept, full.document_id)

    async def together(asked: list[Share]) -> list[Compressed]:
        request = {"document_ids": [originals[s.index].document_id for s in asked],
                   "budgets": [s.budget for s in asked], **question, **extra}
        try:
            shorts = await call_many(request)
        except (ServiceError, NotFoundError) as exc:  # one left the cache since it was counted: one by one
            if isinstance(exc, ServiceError) and exc.code is not Code.NOT_FOUND:
                raise
            return list(await asyncio.gather(*(one(s) for s in asked)))
        return [Compressed(s.index, short.compressed_context, originals[s.index].original_tokens, short.compressed_tokens,
                           originals[s.index].document_id) for s, short in zip(asked, shorts)]

    todo = [s for s in shares if not s.whole]
    ranked = [s for s in todo if question and not s.by_its_end] if call_many is not None else []
    work = [one(s) for s in todo if s not in ranked] + ([together(ranked)] if ranked else [])
    done = {}
    for finished in await asyncio.gather(*work):
        for c in finished if isinstance(finished, list) else [finished]:
            done[c.index] = c
    if frozen is not None:
        for i, w in originals.items():
            if i in fixed:
                text, kept = fixed[i]
                if kept != w.original_tokens or text != split.text(i):
                    done[i] = Compressed(i, text, w.original_tokens, kept, w.document_id)
            else:
                frozen[w.document_id] = (done[i].text, done[i].after) if i in done else (split.text(i), w.original_tokens)
    return ChatCompression([done[i] for i in sorted(done)], before, budget, originals, split.query)


def _question(split: ChatSplit, whole: dict[int, CompressResult], query: str | None) -> dict[str, Any]:
    """What the compressed messages are ranked by: `query` when given, else the last user message (its
    last QUERY_TOKENS tokens when it is long); {} when there is neither."""
    if query is not None:
        return {"query": query}
    if split.query is None:
        return {}
    asked = whole.get(split.last_user)  # counted alone when it may be long
    if asked is not None and is_long_query(asked.original_tokens):
        return {"query_ids": asked.token_ids[:asked.original_tokens][-QUERY_TOKENS:]}
    return {"query": split.query}
