"""What the sidecar sends the engine for one request, and what its answer to the client says about it:
the plan (Forwarded), why a request went through as it came, the x-ilre-* headers, and errors in the
shape the engines use."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse

from .formats import RouteFormat
from .retrieve import Rounds

# why a compressible request went to the engine as it came (ilre_sidecar_passthrough_total{reason})
PASSTHROUGH_CAUSES = ("fits_budget", "no_context", "no_prompt", "not_readable", "other_tokenizer")


@dataclass
class Forwarded:
    """What goes to the engine for one request, and what the response headers report."""

    path: str
    content: Any                         # bytes, or the client's body stream
    action: str                          # compressed | passthrough | off
    original_tokens: int | None = None
    forwarded_tokens: int | None = None
    compress_ms: float = 0.0
    reason: str | None = None            # why a compressible request went through untouched, in words
    cause: str | None = None             # ... as a label: PASSTHROUGH_CAUSES
    field: str | None = None             # the request field the reason is about, when one is
    rounds: Rounds | None = None         # retrieve rounds on: the loop's state (retrieve.py)


def passed_through(fmt: RouteFormat, body: bytes, cause: str, reason: str, tokens: int | None = None,
                   start: float | None = None, field: str | None = None) -> Forwarded:
    """The request forwarded as it came (`body`, its bytes), saying why (`cause`: one of PASSTHROUGH_CAUSES)."""
    assert cause in PASSTHROUGH_CAUSES, cause
    return Forwarded(fmt.path, body, "passthrough", tokens, tokens, ms(start) if start is not None else 0.0,
                     reason=reason, cause=cause, field=field)


def report(plan: Forwarded) -> dict[str, str]:
    """The x-ilre-* response headers: what the sidecar did with the prompt."""
    headers = {"x-ilre-action": plan.action}
    if plan.original_tokens is not None:
        headers.update({"x-ilre-original-tokens": str(plan.original_tokens),
                        "x-ilre-compressed-tokens": str(plan.forwarded_tokens),
                        "x-ilre-compress-ms": f"{plan.compress_ms:.1f}"})
    if plan.reason:  # a header value: one line of printable ASCII
        headers["x-ilre-reason"] = " ".join(plan.reason.split()).encode("ascii", "replace").decode()[:300]
    return headers if plan.action != "other" else {}


def engine_error(status: int, message: str, field: str | None = None, code: str | None = None) -> JSONResponse:
    """An error in the shape engines use (OpenAI style), so that existing clients parse it."""
    kind = "invalid_request_error" if status == 400 else "ilre_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": field, "code": code or status}},
                        status_code=status)


def error_message(body: bytes, encoding: str | None) -> str:
    """What an engine's error body says: its error.message (OpenAI, SGLang, llama.cpp), message or
    detail (FastAPI), else the start of its text."""
    if encoding not in (None, "identity"):
        return f"{len(body)} bytes ({encoding})"
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        for found in ((error.get("message") if isinstance(error, dict) else error), data.get("message"), data.get("detail")):
            if isinstance(found, str) and found:
                return found[:500]
    text = " ".join(body.decode("utf-8", "replace").split())
    return text[:500] or "(empty body)"


def ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0


