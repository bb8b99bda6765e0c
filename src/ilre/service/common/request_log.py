"""Logs: `--log-format json` writes every record as one JSON object per line, and each request
gets one line of its own (logger `ilre.requests`, level INFO) with its id, the API key's name
(never the key), the method, the status code, its sizes and timings.

    {"time": "2026-11-23T20:15:02.114Z", "level": "INFO", "logger": "ilre.requests",
     "message": "grpc.Compress OK", "request_id": "9f2c...", "key": "team-a", "code": "OK",
     "original_tokens": 16384, "compressed_tokens": 1024, "queries": 1, "seconds": 5.9,
     "timings_ms": {"queue": 1.2, "tokenize": 30.1, "prefill": 5804.0, ...}}
"""

from __future__ import annotations

import datetime
import json
import logging
import re
import uuid
from typing import Any

from ...contract.messages import CompressResults
from .errors import Code, ServiceError

REQUESTS = logging.getLogger("ilre.requests")
FORMATS = ("text", "json")
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
TEXT_FORMAT = "%(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ms), level, logger, message, the record's `fields`."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
        out: dict[str, Any] = {"time": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                               "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        out.update(getattr(record, "fields", {}))
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure_logging(fmt: str = "text", level: str | None = None) -> None:
    """The process's log format and level (default: INFO with json, so that request lines show; WARNING with text)."""
    if fmt not in FORMATS:
        raise ValueError(f"log-format: must be one of {', '.join(FORMATS)} (got {fmt!r})")
    name = (level or ("info" if fmt == "json" else "warning")).upper()
    if not isinstance(logging.getLevelName(name), int):
        raise ValueError(f"log-level: must be debug, info, warning or error (got {level!r})")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(name)


def request_id(given: str | None) -> str:
    """The caller's request id (x-request-id) when it is usable, else a new one (32 hex digits)."""
    if given is None:
        return uuid.uuid4().hex
    if not REQUEST_ID.fullmatch(given):
        raise ServiceError(Code.INVALID_ARGUMENT, "x-request-id: must be 1-128 characters of A-Z a-z 0-9 . _ : -",
                           "x-request-id")
    return given


def log_request(rid: str, key: str, method: str, seconds: float, outcome: CompressResults | None = None,
                error: ServiceError | None = None) -> None:
    """The request's one line: what it was, who sent it, how it ended, its sizes and timings."""
    if not REQUESTS.isEnabledFor(logging.INFO):
        return
    code = error.code.value if error is not None else "OK"
    fields: dict[str, Any] = {"request_id": rid, "key": key, "method": method, "code": code, "seconds": round(seconds, 4)}
    if error is not None:
        fields["error"] = error.message
    if outcome is not None:
        results = outcome.results
        fields.update(original_tokens=results[0].original_tokens, compressed_tokens=results[0].compressed_tokens,
                      queries=len(results), strategy=results[0].strategy, layer=results[0].layer,
                      timings_ms={k: round(v, 2) for k, v in results[0].timings_ms.items()})
    REQUESTS.info("%s %s %s", method, code, rid, extra={"fields": fields})
