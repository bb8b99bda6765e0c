"""The two line formats of `ilre batch`, recognised line by line, and what each becomes.

- ilre's own: `{"id", "context", "query", optional "budget" | "ratio" | "strategy" | ...}` (the CLI/JSON contract),
  one result line each, a bad line `{"id", "error"}` in its place.
- OpenAI batch requests (`{"custom_id", "method": "POST", "url", "body"}`: what `vllm run-batch` and the OpenAI,
  Together and LiteLLM batch APIs take) for `/v1/chat/completions`, `/v1/responses` and `/v1/completions`: the same
  line with its body compressed by the rules the sidecar and the gateway apply to that API (contract/chat.py, one
  reading of a conversation in contract/conversation.py; a completion's prompt is one long user message, compressed
  by its own last tokens), ready for the same runner. A line that cannot be compressed goes to the error file in
  the Batch API's error shape (`{"id", "custom_id", "response": null, "error": {"code", "message"}}`), or with
  `pass_errors` to the output unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from ...compressor.strategies import requested_strategy
from ...contract.conversation import NotReadable, read_conversation
from ...contract.defaults import DEFAULT_BUDGET
from ...contract.messages import CompressRequest, CompressResult, CompressResults, InputError, budget_for
from ...service.common.errors import Code, ServiceError
from ...service.transport.chat_compression import compress_chat

URLS = {"/v1/chat/completions": "openai.chat", "/v1/responses": "openai.responses", "/v1/completions": None}
BATCH_FIELDS = {"custom_id", "method", "url", "body"}

Run = Callable[[dict[str, Any]], Awaitable[CompressResults]]  # contract fields -> the results (ServiceError on failure)
LINE_FAULTS = (Code.INVALID_ARGUMENT, Code.NOT_FOUND)  # a line's own fault: its error line; other failures stop the run


@dataclass
class Outcome:
    """What one input line became: the line for the output (or for the error file, `error`), its key (id or
    custom_id), the context tokens before and after, and whether it failed."""

    record: dict[str, Any]
    key: Any = None
    error: bool = False
    to_errors: bool = False  # goes to the error file (an OpenAI batch line that could not be compressed)
    tokens_in: int = 0
    tokens_out: int = 0
    passed: bool = False  # written to the output unchanged (`pass_errors`)


@dataclass
class LineRules:
    """How lines are compressed: the command line's request fields (defaults for ilre lines, the budget or ratio of
    an OpenAI body's messages), and whether an OpenAI line that cannot be compressed is written unchanged."""

    defaults: dict[str, Any] = field(default_factory=dict)
    pass_errors: bool = False

    def budget_for(self, total: int) -> int:
        """The budget of an OpenAI body whose text messages hold `total` tokens (--budget, --ratio, else 1,024)."""
        return budget_for(self.defaults.get("budget"), self.defaults.get("ratio"), total, DEFAULT_BUDGET)

    def chat_fields(self) -> dict[str, Any]:
        """The request fields every message's compression takes (whole units unless --granularity says)."""
        named = {k: v for k, v in self.defaults.items() if v is not None and k not in ("budget", "ratio")}
        return {"granularity": "unit", **named}


def line_key(raw: bytes) -> Any:
    """The id (ilre) or custom_id (OpenAI) a raw input line names, None when it names none or does not parse."""
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    return data.get("custom_id") if is_batch_request(data) else data.get("id")


def record_key(record: dict[str, Any]) -> Any:
    """The key an output or error line carries (the same as its input line's)."""
    return record.get("custom_id", record.get("id"))


def is_batch_request(data: dict[str, Any]) -> bool:
    """Whether a parsed line is an OpenAI batch request (it has the Batch API's fields, not ilre's)."""
    return "custom_id" in data and "body" in data and "context" not in data


async def compress_line(raw: bytes, number: int, rules: LineRules, run: Run) -> Outcome:
    """One input line compressed through `run` (one contract request -> its results). A line's own fault (bad
    input, a document the service does not hold) becomes its error line; a failure of the service (ServiceError
    of another code: unavailable past the retries) is raised, and the run stops with the line not done."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return _ilre_error(None, f"line {number}: not valid UTF-8 (offset {exc.start})")
    except json.JSONDecodeError as exc:
        return _ilre_error(None, f"line {number}: not valid JSON ({exc.msg} at column {exc.colno})")
    if isinstance(data, dict) and is_batch_request(data):
        return await _batch_request(data, number, rules, run)
    key = data.get("id") if isinstance(data, dict) else None
    try:
        if not isinstance(data, dict):
            raise InputError("request", "must be a JSON object")
        fields = CompressRequest.merged_fields(data, rules.defaults)
        requested_strategy(CompressRequest(**fields))  # checked here, options included: the error names the field
        results = await run(fields)
    except InputError as exc:
        return _ilre_error(key, str(exc))
    except TypeError as exc:  # a field of the wrong JSON type
        return _ilre_error(key, f"request: {exc}")
    except ServiceError as exc:
        if exc.code not in LINE_FAULTS:
            raise
        return _ilre_error(key, str(exc))
    tokens = sum(r.original_tokens for r in results.results), sum(r.compressed_tokens for r in results.results)
    return Outcome(results.to_dict(), key, tokens_in=tokens[0], tokens_out=tokens[1])


def failed_line(raw: bytes | int, number: int, message: str, rules: LineRules) -> Outcome:
    """The error line of input line `number` that could not be compressed for `message` (a line over the byte cap,
    given as its length; or one that failed every try): in the Batch API's error shape for an OpenAI batch request,
    ilre's {id, error} otherwise."""
    data = None
    if isinstance(raw, bytes):
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
    if isinstance(data, dict) and is_batch_request(data):
        return _batch_error(data, data.get("custom_id"), number, "failed", message, rules)
    return _ilre_error(data.get("id") if isinstance(data, dict) else None, f"line {number}: {message}")


def _ilre_error(key: Any, message: str) -> Outcome:
    return Outcome({"id": key, "error": message}, key, error=True)


async def _batch_request(data: dict[str, Any], number: int, rules: LineRules, run: Run) -> Outcome:
    """An OpenAI batch request line: the same line with its body compressed, or its error line."""
    key = data.get("custom_id")

    async def call(fields: dict[str, Any]) -> CompressResult:
        return (await run(fields)).results[0]

    async def call_many(fields: dict[str, Any]) -> list[CompressResult]:
        return (await run(fields)).results

    try:
        body = _checked(data)
        api = URLS[data["url"]]
        if api is None:  # a completion: its prompt is one user message, compressed by its own end
            messages = [{"role": "user", "content": body["prompt"]}]
            done = await compress_chat(call, messages, rules.budget_for, fields=rules.chat_fields(), call_many=call_many)
            out = {**body, "prompt": done.compressed[0].text} if done.compressed else body
        else:
            conversation = read_conversation(api, body)
            done = await compress_chat(call, conversation.messages, rules.budget_for, fields=rules.chat_fields(),
                                       call_many=call_many)
            out = conversation.write(body, {c.index: c.text for c in done.compressed}) if done.compressed else body
    except NotReadable as exc:
        return _batch_error(data, key, number, "invalid_request", f"body.{exc}", rules)
    except InputError as exc:
        return _batch_error(data, key, number, "invalid_request", str(exc), rules)
    except ServiceError as exc:
        if exc.code not in LINE_FAULTS:
            raise
        return _batch_error(data, key, number, exc.code.value.lower(), str(exc), rules)
    return Outcome({**data, "body": out}, key, tokens_in=done.before, tokens_out=done.after)


def _checked(data: dict[str, Any]) -> dict[str, Any]:
    """The body of a well-formed batch request line (InputError naming the field otherwise)."""
    unknown = sorted(set(data) - BATCH_FIELDS)
    if unknown:
        raise InputError(unknown[0], "unknown field of a batch request line (custom_id, method, url, body)")
    if not isinstance(data["custom_id"], str) or not data["custom_id"]:
        raise InputError("custom_id", "must be a non-empty string")
    if data.get("method") != "POST":
        raise InputError("method", f"must be POST (got {data.get('method')!r})")
    if data.get("url") not in URLS:
        raise InputError("url", f"must be one of {', '.join(URLS)} (got {data.get('url')!r})")
    body = data["body"]
    if not isinstance(body, dict):
        raise InputError("body", "must be an object")
    if URLS[data["url"]] is None and not isinstance(body.get("prompt"), str):
        raise InputError("body.prompt", "must be one text prompt (a list of prompts is not compressed)")
    return body


def _batch_error(data: dict[str, Any], key: Any, number: int, code: str, message: str, rules: LineRules) -> Outcome:
    if rules.pass_errors:
        return Outcome(data, key, error=True, passed=True)
    record = {"id": f"batch_req_{number}", "custom_id": key, "response": None,
              "error": {"code": code, "message": f"line {number}: {message}"}}
    return Outcome(record, key, error=True, to_errors=True)
