"""The gateway shape of POST /v1/compress and GET /v1/retrieve/{hash}: chat messages in, the same
messages out with the long ones compressed, each naming a hash the model can take the rest back by.

This is the compression contract LiteLLM's `headroom` guardrail (and gateways like it) speak, so a
proxy reaches ilre by its URL alone (`api_base`). What a call does:

- The request: {"messages": [OpenAI chat messages], "model"?: str} plus ilre's optional "query"
  (what to rank by), "budget" (tokens of all the text messages after compression; default the
  service's) and "granularity" (default "unit": whole sentences, lines, records, never across a message).
- Which messages are compressed, to what share of the budget, and what the query is: contract/chat.py,
  the rules the LiteLLM hook and the sidecar follow too, over the messages contract/conversation.py reads
  (each text part of a content its own message, so a text beside an image is compressed like any). In
  short: tool and function results and user messages other than the last are compressed when their
  content is text (a string or text parts), and so is a last
  user message of documents before a question (over LONG_QUERY tokens) but for its last QUERY_TOKENS
  tokens, and so are system and developer messages over LONG_INSTRUCTIONS tokens (documents pasted into
  the instructions); assistant messages, shorter instructions, the last user message otherwise, messages
  up to a `cache_control` breakpoint, anything of at most QUERY_TOKENS tokens and anything that is not
  text are kept as they are. Each compressed message gets its share of what the kept ones leave of the
  budget, in proportion to its tokens; one that fits its share passes whole.
- The query: "query" when given, else the last user message (its last QUERY_TOKENS tokens when it is
  long). With neither (a gateway that withholds the live turn, as `headroom` does), each message is
  ranked by its own last QUERY_TOKENS tokens, which it keeps (ILRe's rule for a prompt with no separate
  question).
- A compressed message starts with a marker naming its hash (`HASH_CHARS` hex digits: the first
  digits of the document id of the whole message, in the caller's document scope), listed in
  `ccr_hashes`. The answer also carries tokens_before, tokens_after (markers included),
  tokens_saved, compression_ratio (after / before) and transforms_applied.
- GET /v1/retrieve/{hash}: without `query` the original text (`original_content`); with `query`
  that original compressed for it (`budget`, default RETRIEVE_BUDGET) from the cached encode. 404 once
  the document has left the cache; a hash is found only with the API key (scope) that made it.

Every model call goes through Frontend.compress, so keys, quotas, the queue, logs and traces apply
to each message as to any request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from ...contract.conversation import NotReadable, read_conversation
from ...contract.document_ids import HASH_CHARS, is_hex
from ...contract.messages import CompressResult, GRANULARITIES, InputError
from ..common.errors import Code, ServiceError
from ..common.keys import ANONYMOUS, KeyPolicy
from .chat_compression import compress_chat, count_tokens
from .frontend import Frontend

NOT_FOUND = "hash: no such document in the cache (expired, evicted, or made with another API key)"
GATEWAY, RETRIEVE = "http.gateway", "http.retrieve"  # the methods their requests are counted and logged under
RETRIEVE_BUDGET = 1024  # tokens of the original a query-aware retrieve returns when the caller sets none
MARKER = ("[ilre kept {kept} of {original} tokens of this message for the current question. To read more of it, "
          "call headroom_retrieve with hash \"{hash}\" and a query saying what you need.]\n")


@dataclass(frozen=True)
class Call:
    """Who asks and on what terms, for every request a gateway call makes: the deadline (None = the
    configured one), the API key's policy, the request id and the caller's trace headers."""

    timeout: float | None
    caller: KeyPolicy = ANONYMOUS
    rid: str = ""
    trace: Mapping[str, str] | None = None


def is_gateway_request(data: Any) -> bool:
    """True for the gateway shape: `messages` and no context, context_ids or document_id."""
    return isinstance(data, dict) and "messages" in data and not any(
        k in data for k in ("context", "context_ids", "document_id"))


def _messages(data: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
    """(the request's messages, its "query" or None) or InputError naming the field."""
    messages = data["messages"]
    if not isinstance(messages, list) or not messages:
        raise InputError("messages", "must be a non-empty list of chat messages")
    unknown = sorted(set(data) - {"messages", "model", "query", "budget", "granularity", "id"})
    if unknown:
        raise InputError(unknown[0], "is not a field of the gateway request (messages, model, query, budget, granularity)")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InputError(f"messages[{i}]", "must be an object with a string `role`")
        try:  # it comes back in the answer, which is strict JSON
            json.dumps(message, allow_nan=False)
        except ValueError:
            raise InputError(f"messages[{i}]", "must not hold NaN or Infinity") from None
        if not (message.get("content") is None or isinstance(message["content"], (str, list))):
            raise InputError(f"messages[{i}].content", "must be a string, a list of parts or null")
    query = data.get("query")
    if query is not None and (not isinstance(query, str) or not query.strip()):
        raise InputError("query", "must be a non-empty string")
    return messages, query


def _budget(data: dict[str, Any], default: int) -> int:
    budget = data.get("budget", default)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise InputError("budget", f"must be a positive integer (got {budget!r})")
    return budget


def _granularity(data: dict[str, Any]) -> str:
    granularity = data.get("granularity", "unit")
    if granularity not in GRANULARITIES:
        raise InputError("granularity", f"must be one of {', '.join(GRANULARITIES)} (got {granularity!r})")
    return granularity


def _retrieve_fields(hash_: str, query: str | None, budget: str | None) -> dict[str, Any]:
    """The compress request a retrieve makes (InputError naming a bad path or query parameter)."""
    if len(hash_) != HASH_CHARS or not is_hex(hash_):
        raise InputError("hash", f"must be the {HASH_CHARS} lowercase hex digits a compressed message names "
                                 f"(got {hash_[:40]!r})")
    if query is not None and not query.strip():
        raise InputError("query", "must not be empty when given")
    if budget is not None and (not budget.isdigit() or int(budget) < 1):
        raise InputError("budget", f"must be a positive integer (got {budget[:20]!r})")
    if query is None:
        return {"document_id": hash_, "query": ".", "ratio": 1.0}
    return {"document_id": hash_, "query": query, "budget": int(budget or RETRIEVE_BUDGET), "granularity": "unit"}


class Gateway:
    """The gateway routes over one Frontend; `budget` is the service's default (`ilre serve --budget`)."""

    def __init__(self, frontend: Frontend, budget: int):
        self.frontend, self.budget = frontend, budget

    async def _call(self, fields: dict[str, Any], call: Call, method: str = GATEWAY) -> CompressResult:
        return (await self._call_many(fields, call, method, many=False))[0]

    async def _call_many(self, fields: dict[str, Any], call: Call, method: str = GATEWAY,
                         many: bool | None = None) -> list[CompressResult]:
        outcome = await self.frontend.compress(fields, call.timeout, method, many=many, caller=call.caller,
                                               rid=call.rid, trace_parent=call.trace)
        return outcome.results

    def _refused(self, method: str, exc: InputError) -> ServiceError:
        """A request refused before any call reached the front end, counted as the front end counts its own."""
        self.frontend.metrics.requests.labels(method).inc()
        self.frontend.record_error(Code.INVALID_ARGUMENT)
        return ServiceError.from_input(exc)

    async def compress(self, data: dict[str, Any], call: Call) -> dict[str, Any]:
        """The gateway answer to `data` (see the module docstring); ServiceError as any request."""
        try:
            messages, query = _messages(data)
            budget, granularity = _budget(data, self.budget), _granularity(data)
        except InputError as exc:
            raise self._refused(GATEWAY, exc) from None
        try:  # each text part its own message, as every door reads a conversation (contract/conversation.py)
            conversation = read_conversation("openai.chat", {"messages": messages})
        except NotReadable as exc:
            raise self._refused(GATEWAY, InputError(exc.field, str(exc).partition(": ")[2])) from None
        done = await compress_chat(lambda fields: self._call(fields, call), conversation.messages, lambda _: budget,
                                   query, {"granularity": granularity},
                                   call_many=lambda fields: self._call_many(fields, call))
        markers = {c.index: MARKER.format(kept=c.after, original=c.before, hash=c.hash) for c in done.compressed}
        out = conversation.write({"messages": messages}, {c.index: markers[c.index] + c.text for c in done.compressed})
        marked = await count_tokens(lambda fields: self._call(fields, call), "".join(markers.values()))
        hashes = [c.hash for c in done.compressed]
        before, after = done.before, done.after + marked
        transforms = [f"ilre:{granularity}"] if hashes else []
        return {"messages": out["messages"], "tokens_before": before, "tokens_after": after, "tokens_saved": before - after,
                "compression_ratio": round(after / before, 6) if before else 1.0,
                "transforms_applied": transforms, "ccr_hashes": hashes}

    async def retrieve(self, hash_: str, query: str | None, budget: str | None, call: Call) -> dict[str, Any]:
        """The original behind `hash_`, whole or compressed for `query`; NotFound (404) once it left the cache."""
        try:
            fields = _retrieve_fields(hash_, query, budget)
        except InputError as exc:
            raise self._refused(RETRIEVE, exc) from None
        try:
            result = await self._call(fields, call, RETRIEVE)
        except ServiceError as exc:
            if exc.code is Code.NOT_FOUND:  # the hash is what the caller sent
                raise ServiceError(Code.NOT_FOUND, NOT_FOUND, "hash") from None
            raise
        return {"hash": hash_, "original_content": result.compressed_context, "query": query,
                "original_tokens": result.original_tokens, "returned_tokens": result.compressed_tokens,
                "compressed": not result.passthrough}
