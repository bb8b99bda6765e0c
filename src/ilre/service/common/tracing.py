"""OpenTelemetry spans for the stages of a request; off unless configured.

`--tracing otlp` (env ILRE_TRACING) exports by OTLP over HTTP to the endpoint of the standard
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT variables (default
http://localhost:4318/v1/traces); `--tracing console` prints each span as JSON on stdout. The
service name is OTEL_SERVICE_NAME, else ilre-<command>.

One trace per request:
  ilre.request (SERVER: method, request id, key name, sizes, status code)
    ilre.queue       enqueue -> result (the in-process batcher, or Redis and a worker)
      ilre.compress  the engine's work (in the worker's process on Redis: the trace context travels
                     in the stream entry as W3C `traceparent`)
        queue.wait, tokenize, prefill, score, allocate, detokenize   from the engine's timings
    ilre.forward     the sidecar's call to the engine
A caller's own `traceparent` (HTTP header or gRPC metadata) becomes the parent of ilre.request.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Mapping

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

log = logging.getLogger(__name__)

MODES = ("off", "otlp", "console")
STAGES = ("tokenize", "prefill", "score", "allocate", "detokenize")  # in the order the engine runs them

_provider: Any = None  # the TracerProvider of this process while tracing is on


def setup_tracing(mode: str, service: str, environ: Mapping[str, str] = os.environ) -> None:
    """Turn tracing on (otlp | console) or off for this process; replaces an earlier set-up."""
    global _provider
    if mode not in MODES:
        raise ValueError(f"tracing: must be one of {', '.join(MODES)} (got {mode!r})")
    shutdown_tracing()
    if mode == "off":
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME") or service}))
    if mode == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=500))
    else:
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    _provider = provider


def shutdown_tracing() -> None:
    """Export what is buffered and turn tracing off."""
    global _provider
    if _provider is not None:
        _provider.shutdown()
        _provider = None


def flush() -> None:
    if _provider is not None:
        _provider.force_flush()


def tracer() -> trace.Tracer:
    """This process's tracer: a real one while tracing is on, else a no-op one."""
    return _provider.get_tracer("ilre") if _provider is not None else trace.NoOpTracer()


def inject(carrier: dict[str, str]) -> dict[str, str]:
    """Add the current span's W3C trace context (`traceparent`) to `carrier`; returns it."""
    if _provider is not None:
        propagate.inject(carrier)
    return carrier


def extract(carrier: Mapping[str, str]) -> otel_context.Context | None:
    """The trace context a caller or a queue entry carries (None without one)."""
    if _provider is None or "traceparent" not in carrier:
        return None
    return propagate.extract(dict(carrier))


def stage_spans(timings_ms: Mapping[str, float], end_ns: int | None = None, attributes: Mapping[str, Any] | None = None) -> None:
    """Record the engine's work as `ilre.compress` with one child per stage, under the current span.
    The engine measures each stage's duration (timings_ms); the spans are laid end to end so that
    the last one ends at `end_ns` (now), preceded by the queue wait when one was measured."""
    if _provider is None:
        return
    end_ns = end_ns or time.time_ns()
    stages = [(name, timings_ms.get(name, 0.0)) for name in STAGES if timings_ms.get(name)]
    total = timings_ms.get("total") or sum(ms for _, ms in stages)
    start = end_ns - int(total * 1e6)
    wait = timings_ms.get("queue") or 0.0
    spans = tracer()
    if "queue" in timings_ms:
        spans.start_span("queue.wait", start_time=start - int(wait * 1e6)).end(end_time=start)
    outer = spans.start_span("ilre.compress", start_time=start, attributes=dict(attributes or {}))
    with trace.use_span(outer, end_on_exit=False):
        at = start
        for name, ms in stages:
            spans.start_span(name, start_time=at).end(end_time=at + int(ms * 1e6))
            at += int(ms * 1e6)
    outer.end(end_time=end_ns)
