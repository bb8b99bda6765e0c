"""The in-process batcher (the embedded default): one engine, one compute thread, a bounded queue.

Data flow: `submit` (event loop) appends a job and awaits its future -> the batch loop takes up
to max_batch jobs (waiting at most max_wait for the batch to fill) -> one executor call runs them
in order on the engine thread, skipping jobs whose caller is gone or whose deadline has passed ->
each result is handed back to its future as soon as it is ready.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from ...contract.info import ModelInfo
from ...contract.messages import CompressRequest, CompressResults, ScopedRequest
from ...engine.engine import Engine
from ..common import tracing
from ..common.errors import Code, ServiceError
from ..common.keys import ANONYMOUS, KeyPolicy
from ..common.metrics import Metrics
from ..common.quotas import KeyQuotas
from .batch import run_batch

log = logging.getLogger(__name__)


@dataclass
class _Queued:
    request: CompressRequest
    future: asyncio.Future
    deadline: float                      # time.monotonic()
    scope: str = ""                      # whose documents it reads (KeyPolicy.document_scope)
    accepted: float = field(default_factory=time.monotonic)


class LocalQueue:
    """Batches requests onto one Engine; `engine` may be a ready Engine or a factory run at start."""

    kind = "local"

    def __init__(self, engine: Engine | Callable[[], Engine], metrics: Metrics, *, max_batch: int = 8,
                 max_wait_s: float = 0.005, max_depth: int = 256, document_secret: str | None = None):
        self._engine_source = engine
        self.engine: Engine | None = engine if isinstance(engine, Engine) else None
        self.metrics = metrics
        self.document_secret = document_secret  # None: the engine's own (random for this process)
        if self.engine is not None:
            self._adopt(self.engine)
        self.max_batch, self.max_wait_s, self.max_depth = max_batch, max_wait_s, max_depth
        self._jobs: collections.deque[_Queued] = collections.deque()
        self._running: list[_Queued] = []
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ilre-engine")
        self._tasks: list[asyncio.Task] = []
        self._closing = False
        self.load_error: str | None = None
        self.load_failed = asyncio.Event()
        self.quotas = KeyQuotas()

    async def start(self) -> None:
        """Load the engine (if given a factory) in the background and start the batch loop."""
        loop = asyncio.get_running_loop()
        if self.engine is None:
            self._tasks.append(loop.create_task(self._load()))
        self._tasks.append(loop.create_task(self._batch_loop()))

    async def _load(self) -> None:
        try:
            self.engine = await asyncio.get_running_loop().run_in_executor(self._executor, self._engine_source)
            self._adopt(self.engine)
            log.info("model loaded: %s", self.engine.model_name)
        except Exception as exc:  # reported by readyz/model_info; the process keeps serving health
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.error("model failed to load: %s", self.load_error)
            self.load_failed.set()

    def _adopt(self, engine: Engine) -> None:
        """Serve `engine`: its cache in /metrics, its document ids under the configured secret."""
        self.metrics.documents = engine.documents
        self.metrics.deepening = engine.deepening
        if self.document_secret:
            engine.adopt_secret(self.document_secret.encode())

    async def ready(self) -> bool:
        return self.engine is not None and not self._closing

    async def depth(self) -> int:
        return self._depth()

    def _depth(self) -> int:
        """Accepted jobs whose caller still waits (abandoned ones free their slot at once)."""
        return sum(not job.future.done() for job in (*self._jobs, *self._running))

    async def model_info(self) -> ModelInfo:
        if self.engine is None:
            raise ServiceError(Code.UNAVAILABLE, self._not_loaded())
        return self.engine.info()

    def _not_loaded(self) -> str:
        return f"model: failed to load ({self.load_error})" if self.load_error else "model: still loading"

    async def submit(self, request: CompressRequest, timeout_s: float, caller: KeyPolicy = ANONYMOUS,
                     rid: str = "") -> CompressResults:
        """Queue one request and await its result within `timeout_s`; the caller's key limits apply."""
        if self._closing:
            raise ServiceError(Code.UNAVAILABLE, "service: shutting down")
        if self.engine is None:
            raise ServiceError(Code.UNAVAILABLE, self._not_loaded())
        depth = self._depth()
        if depth >= self.max_depth:
            raise ServiceError(Code.RESOURCE_EXHAUSTED,
                               f"queue: {depth} requests waiting, the limit is {self.max_depth} (max_queue)")
        self.quotas.admit(caller, self.max_depth)
        try:
            outcome = await self._queue_and_wait(request, timeout_s, depth, caller.document_scope)
        finally:
            self.quotas.release(caller)
        for one in outcome.results:  # the engine ran here: its stages are spans of this request's trace
            tracing.stage_spans(one.timings_ms, attributes={"ilre.request_id": rid})
        return outcome

    async def _queue_and_wait(self, request: CompressRequest, timeout_s: float, depth: int, scope: str) -> CompressResults:
        job = _Queued(request, asyncio.get_running_loop().create_future(), time.monotonic() + timeout_s, scope)
        self._jobs.append(job)
        self.metrics.queue_depth.set(depth + 1)
        self._wakeup.set()
        try:
            return await asyncio.wait_for(asyncio.shield(job.future), timeout_s)
        except asyncio.TimeoutError:
            raise ServiceError(Code.DEADLINE_EXCEEDED, f"deadline: no result within {timeout_s:.3g} s") from None
        finally:
            job.future.cancel()  # no-op when done; otherwise the batch loop drops the job

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._jobs:
                self._wakeup.clear()
                await self._wakeup.wait()
            if len(self._jobs) < self.max_batch and self.max_wait_s > 0:
                await asyncio.sleep(self.max_wait_s)  # let the batch fill up
            batch = [self._jobs.popleft() for _ in range(min(self.max_batch, len(self._jobs)))]
            batch = [job for job in batch if self._still_wanted(job)]
            if not batch:
                continue
            self.metrics.batch_size.observe(len(batch))
            self._running = batch
            try:
                await loop.run_in_executor(self._executor, self._run_batch, batch, loop)
            finally:
                self._running = []
                self.metrics.queue_depth.set(self._depth())

    def _still_wanted(self, job: _Queued) -> bool:
        """False (and counted as dropped) when the caller is gone or the deadline has passed."""
        if job.future.done() or time.monotonic() >= job.deadline:
            self.metrics.dropped.inc()
            return False
        return True

    def _run_batch(self, batch: list[_Queued], loop: asyncio.AbstractEventLoop) -> None:
        """On the engine thread: run the still-wanted jobs as one Engine.compress_many batch (short
        requests may share a batched prefill) and hand each outcome back as soon as it is ready."""
        if self._closing:
            for job in batch:
                loop.call_soon_threadsafe(_deliver, job.future, ServiceError(Code.UNAVAILABLE, "service: shutting down"))
            return
        jobs = [job for job in batch if self._still_wanted(job)]
        started = time.monotonic()
        run_batch(self.engine, [ScopedRequest(job.request, job.scope) for job in jobs],
                  [(started - job.accepted) * 1000.0 for job in jobs], self.metrics,
                  lambda i, outcome: loop.call_soon_threadsafe(_deliver, jobs[i].future, outcome))

    async def close(self) -> None:
        """Stop taking work, fail what is still queued with UNAVAILABLE, stop the loop and thread."""
        self._closing = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        while self._jobs:
            _deliver(self._jobs.popleft().future, ServiceError(Code.UNAVAILABLE, "service: shutting down"))
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)


def _deliver(future: asyncio.Future, outcome: CompressResults | BaseException) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
