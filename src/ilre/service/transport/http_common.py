"""The HTTP layer every route shares (the JSON mirror and the sidecar): reading a bounded body,
decoding it to JSON that is safe to hand on, a deadline header, and racing work against a client
that goes away. Every failure is a ServiceError that names the field and the limit.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import Request

from ..common.errors import Code, ServiceError

MAX_JSON_DEPTH = 64          # arrays/objects nested deeper than this are refused
MAX_INT_DIGITS = 4300        # digits of an integer literal (Python's own conversion limit)
DISCONNECT_POLL_S = 0.25     # how often a waiting request checks that its client is still there


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with RESOURCE_EXHAUSTED (413) beyond `limit` bytes."""
    declared = request.headers.get("content-length")
    too_big = ServiceError(Code.RESOURCE_EXHAUSTED, f"request: body exceeds the limit of {limit} bytes (max_message_bytes)",
                           "request", http_status=413)
    if declared and declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


def decode_json(body: bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Strict UTF-8 JSON whose strings are valid Unicode and whose nesting is at most `max_depth`.

    Python's decoder accepts escaped lone surrogates ("\\ud800"), nesting until the interpreter's
    recursion limit and integers of any length; each of those is turned into INVALID_ARGUMENT here,
    naming the top-level field it sits in, so that nothing downstream sees them.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid("request", f"not valid UTF-8 (byte 0x{body[exc.start]:02x} at offset {exc.start})") from None
    try:
        data = json.loads(text, parse_int=_bounded_int)
    except _TooManyDigits as exc:
        raise _invalid("request", f"a number of {exc.digits} digits exceeds the limit of {MAX_INT_DIGITS} digits") from None
    except RecursionError:
        raise _invalid("request", f"nested deeper than the limit of {max_depth} levels") from None
    except json.JSONDecodeError as exc:
        raise _invalid("request", f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except ValueError as exc:  # e.g. an integer literal beyond the interpreter's digit limit
        raise _invalid("request", f"not usable JSON ({exc})") from None
    _check_values(data, max_depth)
    return data


class _TooManyDigits(ValueError):
    def __init__(self, digits: int):
        super().__init__(digits)
        self.digits = digits


def _bounded_int(literal: str) -> int:
    """json's integer hook: the literal's digits checked against MAX_INT_DIGITS before Python converts
    it (whose own refusal talks of interpreter settings instead of the request)."""
    digits = len(literal) - literal.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise _TooManyDigits(digits)
    return int(literal)


def _check_values(data: Any, max_depth: int) -> None:
    """Walk `data` without recursion: depth limit and lone surrogates, named by top-level field."""
    stack: list[tuple[Any, int, str]] = [(data, 0, "request")]
    while stack:
        value, depth, field = stack.pop()
        if isinstance(value, str):
            _check_text(value, field)
        elif isinstance(value, (list, dict)):
            if depth >= max_depth:
                raise _invalid(field, f"nested deeper than the limit of {max_depth} levels")
            if isinstance(value, dict):
                for key, item in value.items():
                    name = _printable(key) if depth == 0 else field
                    _check_text(key, name)
                    stack.append((item, depth + 1, name))
            elif not all(type(item) is int for item in value):  # token-ID lists need no walk
                stack.extend((item, depth + 1, field) for item in value)


def _check_text(text: str, field: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _invalid(field, f"contains a lone surrogate (\\u{ord(text[exc.start]):04x} at character {exc.start}); "
                              "strings must be valid Unicode") from None


def _printable(text: str) -> str:
    """`text` with lone surrogates written as escapes, so that it can be echoed in an error."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _invalid(field: str, message: str) -> ServiceError:
    return ServiceError(Code.INVALID_ARGUMENT, f"{field}: {message}", field)


def parse_timeout(raw: str | None, name: str = "x-request-timeout") -> float | None:
    """Seconds from a deadline header (None when absent); INVALID_ARGUMENT unless a finite number > 0."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise _invalid(name, f"must be a number of seconds > 0 (got {raw!r})")
    return value


async def unless_disconnected(request: Request, work: asyncio.Future) -> Any:
    """The work's result; None (and the work cancelled) if the client disconnects first."""
    try:
        while True:
            done, _ = await asyncio.wait({work}, timeout=DISCONNECT_POLL_S)
            if done:
                return work.result()
            if await request.is_disconnected():
                work.cancel()
                return None
    finally:
        if not work.done():
            work.cancel()
