"""The transport-independent front end: build the request, enqueue it, await it, count it.

gRPC (grpc_server.py) and HTTP (http_app.py) are thin adapters onto `Frontend`; the queue behind
it is the in-process batcher (queue/local.py) or Redis (queue/redis_stream.py), which share one
interface: each records what it ran (result metrics, the engine's stage spans) itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any, Mapping, Protocol

from opentelemetry.trace import SpanKind

from ...compressor.strategies import requested_strategy
from ...contract.info import ModelInfo
from ...contract.messages import CompressRequest, CompressResults, InputError
from ..common import tracing
from ..common.config import ServiceConfig
from ..common.errors import Code, ServiceError
from ..common.keys import ANONYMOUS, KeyPolicy
from ..common.metrics import Metrics
from ..common.request_log import log_request, request_id

log = logging.getLogger(__name__)


class Queue(Protocol):
    """What the front end needs from a queue; `submit` answers a result already counted in the
    front end's metrics and traced under the current span. `kind` names it in /readyz and model info."""

    kind: str

    async def start(self) -> None: ...
    async def submit(self, request: CompressRequest, timeout_s: float, caller: KeyPolicy = ANONYMOUS,
                     rid: str = "") -> CompressResults: ...
    async def ready(self) -> bool: ...
    async def depth(self) -> int: ...
    async def model_info(self) -> ModelInfo: ...
    async def close(self) -> None: ...


class Frontend:
    """defaults: request fields applied when a request leaves them out (`ilre serve --budget ...`)."""

    def __init__(self, queue: Queue, metrics: Metrics, config: ServiceConfig,
                 defaults: dict[str, Any] | None = None):
        self.queue, self.metrics, self.config = queue, metrics, config
        self.defaults = {k: v for k, v in (defaults or {}).items() if v is not None}

    def build_request(self, data: Any) -> CompressRequest:
        """A validated request from contract fields, its strategy and options included (InputError names
        the field and the limit)."""
        try:
            request = CompressRequest.from_json(data, self.defaults)
        except TypeError as exc:
            raise InputError("request", str(exc)) from None
        requested_strategy(request)  # a bad strategy or option refused here, before the queue accepts it
        return request

    async def compress(self, data: dict[str, Any] | CompressRequest, timeout_s: float | None,
                       method: str, many: bool | None = None, caller: KeyPolicy = ANONYMOUS,
                       rid: str | None = None, trace_parent: Mapping[str, str] | None = None) -> CompressResults:
        """Validate `data` (contract fields) and run it through the queue within `timeout_s`
        (None = the configured default); ServiceError on every failure, metrics, a log line and a
        trace on every path. many: True / False when the method takes only requests with / without
        `queries`; caller: the API key's policy (its rate limit and share of the queue apply);
        rid: the request id (new_request_id()); trace_parent: the caller's trace headers."""
        start = time.perf_counter()
        self.metrics.requests.labels(method).inc()
        rid = rid or request_id(None)
        attributes = {"rpc.method": method, "ilre.request_id": rid, "ilre.key": caller.name}
        outcome, failure = None, None
        with tracing.tracer().start_as_current_span("ilre.request", context=tracing.extract(trace_parent or {}),
                                                    kind=SpanKind.SERVER, attributes=attributes) as span:
            try:
                outcome = await self._run(data, timeout_s, method, many, caller, rid)
                return outcome
            except ServiceError as exc:
                failure = exc
                raise
            except asyncio.CancelledError:
                failure = ServiceError(Code.CANCELLED, "request: the caller went away")
                raise
            finally:
                span.set_attribute("ilre.code", failure.code.value if failure else "OK")
                if outcome is not None:
                    first = outcome.results[0]
                    span.set_attributes({"ilre.original_tokens": first.original_tokens,
                                         "ilre.compressed_tokens": first.compressed_tokens})
                log_request(rid, caller.name, method, time.perf_counter() - start, outcome, failure)

    async def _run(self, data: dict[str, Any] | CompressRequest, timeout_s: float | None, method: str,
                   many: bool | None, caller: KeyPolicy, rid: str) -> CompressResults:
        start = time.perf_counter()
        timeout = timeout_s if timeout_s is not None else self.config.request_timeout_s
        try:
            if isinstance(data, CompressRequest):
                request = data
                requested_strategy(request)
            else:
                request = self.build_request(data)
            if many is False and request.multi:
                name = "document_ids" if request.document_ids is not None else "queries"
                raise InputError(name, f"{method} takes one query of one context: send several to CompressQueries")
            if timeout <= 0:
                raise ServiceError(Code.DEADLINE_EXCEEDED, "deadline: already passed on arrival")
            with tracing.tracer().start_as_current_span("ilre.queue", attributes={"ilre.queue": self.queue.kind}):
                result = await self.queue.submit(request, timeout, caller, rid)
        except ServiceError as exc:
            self.record_error(exc.code)
            raise
        except InputError as exc:
            self.record_error(Code.INVALID_ARGUMENT)
            raise ServiceError.from_input(exc) from None
        except asyncio.CancelledError:
            self.record_error(Code.CANCELLED)
            raise
        except Exception as exc:  # a bug: one line to the caller, the traceback to the log
            log.exception("compress failed")
            self.record_error(Code.INTERNAL)
            raise ServiceError(Code.INTERNAL, f"internal: {type(exc).__name__}: {exc}") from None
        self.metrics.latency.labels(method).observe(time.perf_counter() - start)
        return result

    def record_error(self, code: Code) -> None:
        self.metrics.errors.labels(code.value).inc()

    async def model_info(self) -> ModelInfo:
        info = await self.queue.model_info()
        return dataclasses.replace(info, queue=self.queue.kind, max_message_bytes=self.config.max_message_bytes)

    async def ready(self) -> bool:
        ready = await self.queue.ready()
        self.metrics.ready.set(1 if ready else 0)
        return ready

    async def metrics_text(self) -> bytes:
        """The Prometheus exposition, with the queue depth and readiness refreshed."""
        self.metrics.queue_depth.set(await self.queue.depth())
        await self.ready()
        return self.metrics.render()
