"""Service-level failures, independent of the transport: each maps to one gRPC status and one
HTTP status (bad input itself is `messages.InputError`, mapped to INVALID_ARGUMENT)."""

from __future__ import annotations

from enum import Enum

from ...contract.messages import InputError, NotFoundError


class Code(str, Enum):
    """Failure classes, named after the gRPC status codes they map to."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"      # bad input: the message names the field and the limit
    NOT_FOUND = "NOT_FOUND"                    # an unknown or evicted document_id: send the context again
    UNAUTHENTICATED = "UNAUTHENTICATED"        # missing or wrong API key
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"  # the queue is full, or a message is too large
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"    # no result within the caller's deadline
    UNAVAILABLE = "UNAVAILABLE"                # Redis down, model loading, no worker, shutting down
    CANCELLED = "CANCELLED"                    # the caller went away
    INTERNAL = "INTERNAL"                      # a bug, or a request that killed its workers


HTTP_STATUS: dict[Code, int] = {
    Code.INVALID_ARGUMENT: 400, Code.NOT_FOUND: 404, Code.UNAUTHENTICATED: 401, Code.RESOURCE_EXHAUSTED: 429,
    Code.DEADLINE_EXCEEDED: 504, Code.UNAVAILABLE: 503, Code.CANCELLED: 499, Code.INTERNAL: 500,
}


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the setting."""


class ServiceError(Exception):
    """A request that did not produce a result. `field` names the request field when known."""

    def __init__(self, code: Code, message: str, field: str | None = None, http_status: int | None = None,
                 retry_after_s: float | None = None):
        super().__init__(message)
        self.code = Code(code)
        self.message = message
        self.field = field
        self.http_status = http_status or HTTP_STATUS[self.code]  # 413 for a body too large
        self.retry_after_s = retry_after_s  # a limit's refusal: when a retry can succeed

    @classmethod
    def from_input(cls, exc: InputError) -> "ServiceError":
        return cls(Code.NOT_FOUND if isinstance(exc, NotFoundError) else Code.INVALID_ARGUMENT, str(exc), exc.field)

    def to_dict(self) -> dict[str, str | float | None]:
        """The JSON form (HTTP body, Redis result envelope): code, message and field."""
        out = {"code": self.code.value, "message": self.message, "field": self.field}
        if self.retry_after_s is not None:
            out["retry_after_s"] = round(self.retry_after_s, 3)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "ServiceError":
        try:
            code = Code(data.get("code"))
        except ValueError:
            code = Code.INTERNAL
        retry = data.get("retry_after_s")
        return cls(code, str(data.get("message", "")), data.get("field"),
                   retry_after_s=float(retry) if isinstance(retry, (int, float)) else None)
