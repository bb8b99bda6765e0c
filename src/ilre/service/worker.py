"""`ilre worker`: reads the Redis Stream through the consumer group in batches, runs the engine,
writes each result to its per-request key and only then acknowledges the entry.

One loop per worker process:
  every claim_idle/2: XAUTOCLAIM entries idle longer than claim_idle (their worker died) -> entries
      delivered more than max_attempts times go to the dead-letter stream, their callers get INTERNAL
  else: XREADGROUP up to max_batch new entries, waiting at most max_wait for the batch to fill
  drop the entries whose caller is gone or whose deadline passed; compress the rest as one batch on
      the engine thread (queue/batch.py, shared with the in-process batcher); then per entry, in one
      script (FINISH): LPUSH result, EXPIRE, mark it done, XACK, XDEL, unless another worker has
      taken the entry over or answered it meanwhile (this one was cut off or frozen past claim_idle):
      then the late result is dropped, never delivered twice
While a batch runs, its entries are re-claimed (XCLAIM JUSTID) every claim_idle/3, those still this
worker's only, so that no other worker mistakes a long batch for a dead worker and none taken over is
taken back. On SIGTERM the running batch finishes; a batch read but not yet started is put back on
the stream.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import math
import os
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from opentelemetry import trace
from opentelemetry.trace import SpanKind
from redis.exceptions import RedisError, ResponseError

from ..contract.messages import CompressRequest, CompressResults, InputError, ScopedRequest
from ..engine.engine import Engine
from .common import tracing
from .common.config import ServiceConfig
from .common.errors import Code, ServiceError
from .common.metrics import Metrics
from .common.redis_connection import MasterFollower
from .common.redis_url import parse_redis_url
from .common.request_log import log_request
from .documents.redis_tier import RedisDocuments
from .documents.secret import sync_secret
from .queue.batch import run_batch
from .queue.redis_stream import CALL_S, RESULT_GRACE_S, RedisKeys, bounded, connect, encode_outcome, ensure_group
from .queue.scripts import DEAD_LETTER, FINISH, OWN, RENEW

log = logging.getLogger(__name__)

Entry = tuple[str, dict[str, str]]  # (stream entry id, fields)

class Worker:
    """One consumer of the request stream, serving one Engine."""

    def __init__(self, engine: Engine, config: ServiceConfig, *, name: str | None = None,
                 metrics: Metrics | None = None):
        if not config.redis_url:
            raise ValueError("redis_url: a worker needs --redis-url (or ILRE_REDIS_URL)")
        self.engine, self.config = engine, config
        self.client = connect(config.redis_url)
        self.keys = RedisKeys(config.redis_prefix)
        self.name = name or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.metrics = metrics or Metrics()
        self._shared: RedisDocuments | None = None
        if engine.documents.shared is None and config.doc_cache_shared_mb > 0:  # the cache every worker reads
            self._shared = RedisDocuments(config.redis_url, config.redis_prefix,
                                          config.doc_cache_shared_mb << 20, config.doc_cache_ttl_s,
                                          engine.documents.share, wait_replicas=config.wait_replicas,
                                          wait_ms=config.redis_wait_ms, retry_s=config.redis_retry_s)
            engine.documents.shared = self._shared
        self.metrics.documents = engine.documents
        self.metrics.deepening = engine.deepening
        if config.document_secret:  # else the secret on Redis, agreed before the first entry is read
            engine.adopt_secret(config.document_secret.encode())
        self._finish_script = self.client.register_script(FINISH)
        self._renew_script = self.client.register_script(RENEW)
        self._own_script = self.client.register_script(OWN)
        self._dead_letter_script = self.client.register_script(DEAD_LETTER)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ilre-engine")
        self._inflight: set[str] = set()
        self._claim_cursor = "0-0"
        self._next_claim = 0.0
        self._group_ready = False
        self._own_pending = False  # a Redis call failed: entries handed to this worker may be unread
        self.info = engine.info()

    @property
    def claim_idle_s(self) -> float:
        return self.config.claim_idle_ms / 1000.0

    def _follower(self) -> MasterFollower:
        """The queue's client following a Sentinel group's master, the shared document tier's with it."""
        return MasterFollower(self.client, *([self._shared.client] if self._shared is not None else []))

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set; Redis outages are waited out, never fatal."""
        tasks = [asyncio.create_task(self._heartbeat(stop)), asyncio.create_task(self._keep_claimed()),
                 asyncio.create_task(self._follower().run())]
        backoff, down = 0.1, False
        try:
            while not stop.is_set():
                try:
                    if down or not self._group_ready:
                        await ensure_group(self.client, self.keys)
                        await self._sync_secret()
                        self._group_ready = True
                    entries = await self._next_batch()
                    if down:
                        log.warning("worker %s: Redis is back", self.name)
                    backoff, down = 0.1, False
                    if entries:
                        await self._process(entries, stop)
                except ResponseError as exc:
                    if "NOGROUP" in str(exc):
                        self._group_ready = False  # Redis restarted without its data
                    else:  # e.g. Redis out of memory: keep going, slowly
                        log.error("worker %s: Redis refused a command: %s", self.name, exc)
                        await _wait(stop, 1.0)
                except RedisError as exc:
                    if not down:
                        log.warning("worker %s: Redis unreachable (%s); retrying", self.name, type(exc).__name__)
                    down = self._own_pending = True  # a read's reply may be lost: its entries are this worker's
                    await _wait(stop, backoff)
                    backoff = min(backoff * 2, 2.0)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            try:
                await self.client.delete(self.keys.worker(self.name))
            except RedisError:
                pass
            await self.client.aclose()
            self._executor.shutdown(wait=False)
            if self._shared is not None and self.engine.documents.shared is self._shared:
                self.engine.documents.shared = None  # the engine may outlive this worker (tests share one)
                self._shared.close()

    async def _next_batch(self) -> list[Entry]:
        if self._own_pending:  # after a failed call: take back at once what Redis handed this worker unread
            entries = await self._own_unread()
            self._own_pending = False
            if entries:
                return entries
        now = time.monotonic()
        if now >= self._next_claim:
            self._next_claim = now + max(0.05, self.claim_idle_s / 2)
            claimed = await self._reclaim()
            if claimed:
                return claimed
        return await self._read()

    async def _read(self) -> list[Entry]:
        """Up to max_batch new entries: block up to 1 s for the first, max_wait for the rest."""
        cfg = self.config
        entries = await self._xreadgroup(cfg.max_batch, 1000)
        give_up = time.monotonic() + cfg.max_wait_ms / 1000.0
        while entries and len(entries) < cfg.max_batch and (left := give_up - time.monotonic()) > 0:
            more = await self._xreadgroup(cfg.max_batch - len(entries), max(1, int(left * 1000)))
            if not more:
                break
            entries += more
        return entries

    async def _xreadgroup(self, count: int, block_ms: int) -> list[Entry]:
        reply = await self.client.xreadgroup(self.keys.group, self.name, {self.keys.stream: ">"},
                                             count=count, block=block_ms)
        return list(reply[0][1]) if reply else []

    async def _own_unread(self) -> list[Entry]:
        """The entries pending under this worker (OWN: their delivery counts unchanged), handed to it by a read whose
        reply was lost; those deleted meanwhile are acknowledged."""
        reply = await self._own_script(keys=[self.keys.stream],
                                       args=[self.keys.group, self.name, self.config.max_batch])
        kept = [(entry_id, dict(zip(flat[::2], flat[1::2]))) for entry_id, flat in reply]
        if kept:
            self.metrics.own_pending_taken.inc(len(kept))
            log.warning("worker %s: took back %d entries whose delivery reply was lost", self.name, len(kept))
        return kept

    async def _reclaim(self) -> list[Entry]:
        """Take over entries idle past claim_idle; dead-letter those delivered too often."""
        reply = await self.client.xautoclaim(
            self.keys.stream, self.keys.group, self.name, int(self.config.claim_idle_ms),
            start_id=self._claim_cursor, count=self.config.max_batch)
        cursor, claimed = reply[0], reply[1]  # Redis 7 adds a third item (deleted ids), 6.2 does not
        self._claim_cursor = cursor
        claimed = [(entry_id, fields) for entry_id, fields in claimed if entry_id]
        if not claimed:
            return []
        pending = await self.client.xpending_range(self.keys.stream, self.keys.group, claimed[0][0],
                                                   claimed[-1][0], len(claimed) + 100, self.name)
        deliveries = {p["message_id"]: p["times_delivered"] for p in pending}
        keep = []
        for entry_id, fields in claimed:
            if not fields:  # the entry was deleted: nothing left to do
                await self.client.xack(self.keys.stream, self.keys.group, entry_id)
            elif deliveries.get(entry_id, 1) > self.config.max_attempts:
                await self._dead_letter(entry_id, fields, deliveries[entry_id] - 1)
            else:
                keep.append((entry_id, fields))
        if keep:
            self.metrics.reclaimed.inc(len(keep))
            log.warning("worker %s: reclaimed %d entries from a worker silent past claim_idle_ms", self.name, len(keep))
        return keep

    async def _process(self, entries: list[Entry], stop: asyncio.Event) -> None:
        cancelled = await self._cancelled([fields.get("rid", "") for _, fields in entries])
        self.metrics.batch_size.observe(len(entries))
        self._inflight = {entry_id for entry_id, _ in entries}
        loop = asyncio.get_running_loop()
        try:
            if stop.is_set():
                await self._requeue(entries)
                return
            live = []
            for i, (entry_id, fields) in enumerate(entries):
                deadline = _float(fields.get("deadline"))
                if cancelled[i] or time.time() >= deadline:
                    self.metrics.dropped.inc()
                    await self._finish(entry_id, fields, None)
                else:
                    live.append(i)
            writes: list[concurrent.futures.Future] = []

            async def write(i: int, outcome: CompressResults | ServiceError) -> None:
                entry_id, fields = entries[i]
                await self._finish(entry_id, fields, outcome)
                self._inflight.discard(entry_id)

            def ready(k: int, outcome: CompressResults | ServiceError) -> None:  # on the engine thread
                writes.append(asyncio.run_coroutine_threadsafe(write(live[k], outcome), loop))

            if live:
                await loop.run_in_executor(self._executor, self._compress, [entries[i] for i in live], ready)
            for done in writes:
                await asyncio.wrap_future(done)
        finally:  # entries left unfinished (Redis went away) are reclaimed once idle
            self._inflight = set()

    async def _cancelled(self, rids: list[str]) -> list[Any]:
        """Each request's cancel marker (None: not cancelled); when Redis does not answer within a call's bound, none
        counts as cancelled: the entries are this worker's, and their results are written once Redis is back."""
        try:
            return await bounded(self.client.mget([self.keys.cancel(rid) for rid in rids]))
        except RedisError:
            self.metrics.redis_retries.labels("cancel").inc()
            return [None] * len(rids)

    def _compress(self, entries: list[Entry], ready: Callable[[int, CompressResults | ServiceError], None]) -> None:
        """On the engine thread: queued requests (entry id, fields) as one batch (queue/batch.py);
        `ready(k, outcome)` hands each result or error back as soon as it is known, after its log
        line and (with tracing on) its spans under the caller's trace."""
        now_ms = time.time() * 1000.0

        def hand_back(k: int, outcome: CompressResults | ServiceError) -> None:
            fields = entries[k][1]
            if isinstance(outcome, ServiceError):
                self.metrics.errors.labels(outcome.code.value).inc()
            self._record(fields, outcome, (time.time() * 1000.0 - _enqueued_ms(entries[k])) / 1000.0)
            ready(k, outcome)

        requests, slots = [], []
        for k, (_, fields) in enumerate(entries):
            try:
                requests.append(ScopedRequest(_decode(fields.get("payload", "")), _scope(fields)))
                slots.append(k)
            except InputError as exc:
                hand_back(k, ServiceError.from_input(exc))
        run_batch(self.engine, requests, [now_ms - _enqueued_ms(entries[k]) for k in slots], self.metrics,
                  lambda j, outcome: hand_back(slots[j], outcome))

    def _record(self, fields: dict[str, str], outcome: CompressResults | ServiceError, seconds: float) -> None:
        """The worker's log line for one request and, with tracing on, its spans (a child of the
        front end's `ilre.queue` span, through the entry's traceparent)."""
        rid, key = fields.get("request_id", ""), fields.get("key", "")
        failure = outcome if isinstance(outcome, ServiceError) else None
        log_request(rid, key, "worker", seconds, None if failure else outcome, failure)
        parent = tracing.extract({"traceparent": fields.get("traceparent", "")} if fields.get("traceparent") else {})
        if parent is None:
            return
        end = time.time_ns()
        attributes = {"ilre.request_id": rid, "ilre.key": key, "ilre.worker": self.name}
        span = tracing.tracer().start_span("ilre.worker", context=parent, kind=SpanKind.CONSUMER, attributes=attributes,
                                           start_time=end - int(seconds * 1e9))
        with trace.use_span(span, end_on_exit=True):
            for result in ([] if failure else outcome.results):
                tracing.stage_spans(result.timings_ms, end, attributes)
            span.set_attribute("ilre.code", failure.code.value if failure else "OK")

    async def _finish(self, entry_id: str, fields: dict[str, str], outcome: CompressResults | ServiceError | None) -> None:
        """Write the outcome (if any), acknowledge, and free the caller key's slot, atomically (FINISH), unless
        another worker took the entry over meanwhile (the result dropped and counted); retried while Redis is
        down, until the caller's deadline (after it, a later reclaim drops the entry)."""
        rid, deadline = fields.get("rid", ""), _float(fields.get("deadline"))
        ttl = max(1, math.ceil(deadline - time.time())) + RESULT_GRACE_S
        keys = [self.keys.stream, self.keys.result(rid), self.keys.unfinished(fields.get("key", "")), self.keys.done(rid)]
        token = f"{self.name}:{uuid.uuid4().hex}"  # this delivery's: its retries tell their own earlier success
        args = [self.keys.group, entry_id, self.name, "" if outcome is None else encode_outcome(outcome), ttl, rid,
                token]
        backoff = 0.05
        while True:
            try:
                delivered = await bounded(self._finish_script(keys=keys, args=args))
                break
            except RedisError as exc:
                self.metrics.redis_retries.labels("finish").inc()
                if time.time() >= deadline:
                    log.warning("worker %s: could not deliver %s before its deadline (%s)", self.name, rid,
                                type(exc).__name__)
                    return
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
        if delivered == 2:
            log.info("worker %s: %s was delivered by an earlier try whose reply was lost", self.name, rid)
        elif not delivered:
            self.metrics.stale_dropped.inc()
            log.warning("worker %s: dropped its result for %s: another worker took the entry over meanwhile",
                        self.name, rid)

    async def _dead_letter(self, entry_id: str, fields: dict[str, str], attempts: int) -> None:
        message = (f"request: abandoned after {attempts} attempts, each ending with its worker gone "
                   f"(max_attempts {self.config.max_attempts}); moved to {self.keys.dead_letter}")
        rid = fields.get("rid", "")
        keys = [self.keys.stream, self.keys.result(rid), self.keys.unfinished(fields.get("key", "")),
                self.keys.done(rid), self.keys.dead_letter]
        ttl = RESULT_GRACE_S + max(1, math.ceil(_float(fields.get("deadline")) - time.time()))
        extra = {**fields, "entry": entry_id, "attempts": attempts, "reason": message}
        args = [self.keys.group, entry_id, rid, encode_outcome(ServiceError(Code.INTERNAL, message)), ttl,
                *(x for pair in extra.items() for x in pair)]
        if not await self._dead_letter_script(keys=keys, args=args):
            log.warning("worker %s: entry %s was answered meanwhile: acknowledged, not dead-lettered", self.name, entry_id)
            return
        log.error("worker %s: entry %s -> dead letters after %d attempts", self.name, entry_id, attempts)
        self.metrics.errors.labels(Code.INTERNAL.value).inc()

    async def _requeue(self, entries: list[Entry]) -> None:
        """Put unstarted entries back on the stream for other workers (graceful stop)."""
        async with self.client.pipeline(transaction=True) as pipe:
            for entry_id, fields in entries:
                pipe.xadd(self.keys.stream, fields)
                pipe.xack(self.keys.stream, self.keys.group, entry_id)
                pipe.xdel(self.keys.stream, entry_id)
            await pipe.execute()
        log.info("worker %s: stopping; put %d entries back", self.name, len(entries))

    async def _keep_claimed(self) -> None:
        """Reset the idle time of the running batch's entries so they are not reclaimed; an entry another worker
        has taken over meanwhile (this one was cut off or frozen) is left to it."""
        while True:
            period = max(0.05, self.claim_idle_s / 3)
            await asyncio.sleep(period)
            if self._inflight:
                try:
                    lost = await bounded(self._renew_script(keys=[self.keys.stream], args=[
                        self.keys.group, self.name, *sorted(self._inflight)]), max(period, CALL_S))
                except RedisError:
                    continue
                if lost:
                    log.warning("worker %s: %d running entries were taken over by another worker", self.name, len(lost))
                    self._inflight.difference_update(lost)

    async def _sync_secret(self) -> None:
        """Name documents under the secret Redis holds (service/documents/secret.py), unless one is configured."""
        if not self.config.document_secret:
            await sync_secret(self.client, self.keys.document_secret, self.engine, self.name)

    async def _heartbeat(self, stop: asyncio.Event) -> None:
        """Register this worker (its ModelInfo, with a TTL) and follow the document secret, until stopped."""
        info = json.dumps({**self.info.to_dict(), "queue": "redis", "worker": self.name})
        while not stop.is_set():
            try:
                await self.client.set(self.keys.worker(self.name), info, ex=max(1, math.ceil(3 * self.config.heartbeat_s)))
                await self._sync_secret()
            except RedisError:
                pass
            await _wait(stop, self.config.heartbeat_s)


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except asyncio.TimeoutError:
        pass


def _decode(payload: str) -> CompressRequest:
    """The queued request (InputError naming `request` if the entry is not one)."""
    try:
        return CompressRequest.from_json(json.loads(payload))
    except InputError:
        raise
    except (ValueError, TypeError) as exc:
        raise InputError("request", f"malformed queue entry ({exc})") from None


def _scope(fields: dict[str, str]) -> str:
    """Whose documents the entry's request reads: its `scope` field (an entry without one, from an
    older front end: its key's own scope, never everyone's)."""
    scope = fields.get("scope")
    return scope if scope is not None else f"key:{fields.get('key', '')}"


def _enqueued_ms(entry: Entry) -> float:
    """When the entry was added: a stream entry id starts with its time in ms."""
    return _float(entry[0].split("-")[0])


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def run_worker(engine: Engine, config: ServiceConfig, name: str | None = None, metrics_port: int | None = None) -> int:
    """Run one worker until SIGTERM/SIGINT (graceful: the current request finishes)."""
    import signal

    from prometheus_client import start_http_server

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        worker = Worker(engine, config, name=name)
        if metrics_port is not None:
            start_http_server(metrics_port, addr=config.host, registry=worker.metrics.registry)
        log.warning("worker %s: serving %s from %s (batch %d)", worker.name, engine.model_name,
                    _redacted(config.redis_url), config.max_batch)
        await worker.run(stop)

    asyncio.run(main())
    return 0


def _redacted(url: str | None) -> str:
    """The Redis URL without its credentials, for logs."""
    return parse_redis_url(url).redacted() if url else ""
