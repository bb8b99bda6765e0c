"""The batch runner both queues share: one batch of requests on the engine thread.

The in-process batcher (local.py) and the Redis worker (worker.py) differ in where requests come
from and where outcomes go; what happens in between is this: one `Engine.compress_many` call, each
outcome handed back as soon as it is known, bad input mapped to its status, the queue time stamped
into the result's timings, the result counted, and an engine failure answered with INTERNAL for
every request still waiting (the caller's loop goes on).
"""

from __future__ import annotations

import logging
from typing import Callable

from ...contract.messages import CompressResults, InputError, ScopedRequest
from ...engine.engine import Engine
from ..common.errors import Code, ServiceError
from ..common.metrics import Metrics

log = logging.getLogger(__name__)

Deliver = Callable[[int, "CompressResults | ServiceError"], None]


def run_batch(engine: Engine, requests: list[ScopedRequest], queued_ms: list[float], metrics: Metrics,
              deliver: Deliver) -> None:
    """Run `requests` as one batch (call it on the engine thread); never raises. Each carries its caller's
    document scope (KeyPolicy.document_scope).

    deliver(i, outcome) is called once per request, in completion order: its result, with
    timings_ms["queue"] = queued_ms[i] and counted in `metrics`, or a ServiceError (bad input:
    INVALID_ARGUMENT / NOT_FOUND naming the field; an engine failure: INTERNAL)."""
    delivered: set[int] = set()

    def ready(i: int, outcome: CompressResults | InputError) -> None:
        if isinstance(outcome, InputError):
            answer: CompressResults | ServiceError = ServiceError.from_input(outcome)
        else:
            for one in outcome.results:
                one.timings_ms["queue"] = round(max(0.0, queued_ms[i]), 3)
                metrics.observe_result(one.timings_ms, one.original_tokens, one.compressed_tokens, one.resumed_tokens)
            answer = outcome
        delivered.add(i)
        deliver(i, answer)

    try:
        engine.compress_many(requests, on_result=ready)
    except Exception as exc:  # a bug in the engine: the callers still waiting get INTERNAL
        log.exception("compress failed")
        failure = ServiceError(Code.INTERNAL, f"internal: {type(exc).__name__}: {exc}")
        for i in range(len(requests)):
            if i not in delivered:
                deliver(i, failure)
