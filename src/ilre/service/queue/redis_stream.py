"""The Redis queue, front-end side: requests go onto a Redis Stream, results come back on a
per-request key (workers: service/worker.py).

Keys (prefix "ilre" by default):
  {p}:requests       stream of {rid, payload (request JSON), deadline (unix s), key (the API key's name),
                     request_id, traceparent (W3C trace context, '' when tracing is off), scope (whose
                     documents it reads: KeyPolicy.document_scope; never the key)}; bounded by max_queue
  {p}:unfinished:{k} an API key's accepted, unfinished rids (score: deadline), for its queue_share
  {p}:rate:{k}       an API key's rate-limit state
  {p}:workers        the consumer group the workers read through
  {p}:result:{rid}   list holding the result envelope; the front end BLPOPs it within the deadline
  {p}:cancel:{rid}   set when the caller is gone or its deadline passed: workers drop the entry
  {p}:done:{rid}     the delivery (worker:token) that delivered rid's outcome (a late one is dropped, not delivered twice)
  {p}:worker:{name}  a live worker's ModelInfo (JSON), with a TTL refreshed by its heartbeat
  {p}:dead-letter    entries whose workers died max_attempts times
  {p}:document-secret the secret document ids are keyed with (service/documents/secret.py)
Envelope: {"ok": <result dict>} or {"error": {"code", "message", "field"}}.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeout

from ...contract.info import ModelInfo
from ...contract.messages import CompressRequest, CompressResults
from ..common import tracing
from ..common.errors import Code, ServiceError
from ..common.keys import ANONYMOUS, KeyPolicy
from ..common.metrics import Metrics
from ..common.quotas import rate_refusal, share_refusal
from ..common.redis_connection import CALL_S, MasterFollower, async_client
from .scripts import ADMIT

log = logging.getLogger(__name__)

BLOCK_CHUNK_S = CALL_S - 1.0  # a waiting front end re-issues BLPOP at least this often (within one call's bound)
RESULT_GRACE_S = 30  # result and cancel keys outlive the deadline by this much


@dataclass(frozen=True)
class RedisKeys:
    """Key names under one prefix (see the module docstring)."""

    prefix: str = "ilre"

    @property
    def stream(self) -> str:
        return f"{self.prefix}:requests"

    @property
    def group(self) -> str:
        return f"{self.prefix}:workers"

    @property
    def dead_letter(self) -> str:
        return f"{self.prefix}:dead-letter"

    @property
    def document_secret(self) -> str:
        return f"{self.prefix}:document-secret"

    def result(self, rid: str) -> str:
        return f"{self.prefix}:result:{rid}"

    def cancel(self, rid: str) -> str:
        return f"{self.prefix}:cancel:{rid}"

    def done(self, rid: str) -> str:
        """Set when a worker delivers rid's outcome: a late result of another is dropped, not delivered twice."""
        return f"{self.prefix}:done:{rid}"

    def worker(self, name: str) -> str:
        return f"{self.prefix}:worker:{name}"

    def unfinished(self, key_name: str) -> str:
        """Sorted set of an API key's accepted, unfinished request ids (score: deadline)."""
        return f"{self.prefix}:unfinished:{key_name}"

    def rate(self, key_name: str) -> str:
        """An API key's rate-limit state (GCRA's theoretical arrival time)."""
        return f"{self.prefix}:rate:{key_name}"


def connect(url: str) -> aioredis.Redis:
    """An asyncio client (of one server, or of a Sentinel group's master) that fails fast while Redis
    is down and reconnects by itself after, following a failover."""
    return async_client(
        url, decode_responses=True, socket_connect_timeout=2.0, socket_timeout=CALL_S + 1.0,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 2), health_check_interval=10,
    )


async def ensure_group(client: aioredis.Redis, keys: RedisKeys) -> None:
    """Create the stream and the consumer group (from the start, so nothing queued is skipped)."""
    try:
        await client.xgroup_create(keys.stream, keys.group, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def encode_request(request: CompressRequest) -> str:
    return json.dumps({k: v for k, v in dataclasses.asdict(request).items() if v is not None})


def encode_outcome(outcome: CompressResults | ServiceError) -> str:
    if isinstance(outcome, ServiceError):
        return json.dumps({"error": outcome.to_dict()})
    return json.dumps({"ok": outcome.to_dict()})


def decode_outcome(raw: str) -> CompressResults:
    """The result(s) in an envelope, or raise the ServiceError it carries."""
    envelope = json.loads(raw)
    if "ok" in envelope:
        return CompressResults.from_dict(envelope["ok"])
    raise ServiceError.from_dict(envelope.get("error", {}))


def unavailable(exc: BaseException) -> ServiceError:
    return ServiceError(Code.UNAVAILABLE, f"queue: Redis is unreachable ({type(exc).__name__}); retry later")


async def bounded(call: Any, seconds: float = CALL_S) -> Any:
    """Await a Redis call, TimeoutError past `seconds`: a link that silently drops packets fails the call when it
    should, not after the socket's own timeouts and the client's retries."""
    try:
        return await asyncio.wait_for(call, seconds)
    except asyncio.TimeoutError:
        raise RedisTimeout(f"no reply within {seconds:g} s") from None


class RedisQueue:
    """Front-end side of the Redis queue: bounded enqueue, await the result within the deadline."""

    kind = "redis"

    def __init__(self, url: str, metrics: Metrics, *, prefix: str = "ilre", max_depth: int = 256,
                 retry_s: float = 5.0, wait_replicas: int = 0, wait_ms: int = 1000):
        self.client = connect(url)
        self.keys = RedisKeys(prefix)
        self.metrics = metrics
        self.max_depth, self.retry_s = max_depth, retry_s
        self.wait_replicas, self.wait_ms = wait_replicas, wait_ms
        self._admit = self.client.register_script(ADMIT)
        self.master = MasterFollower(self.client)
        self._background: set[asyncio.Task] = set()
        self._follow: asyncio.Task | None = None  # following a Sentinel group's master (redis_connection.py)
        self._depth = 0

    async def start(self) -> None:
        self._follow = asyncio.get_running_loop().create_task(self.master.run())
        try:
            await ensure_group(self.client, self.keys)
        except RedisError as exc:  # not fatal: readyz says not ready until Redis answers
            log.warning("Redis not reachable at start (%s); will keep trying per request", type(exc).__name__)

    async def ready(self) -> bool:
        """Redis answers and at least one worker is registered."""
        try:
            return bool(await bounded(self._workers(limit=1)))
        except RedisError:
            return False

    async def depth(self) -> int:
        try:
            self._depth = await bounded(self.client.xlen(self.keys.stream))
        except RedisError:
            pass
        return self._depth

    async def _workers(self, limit: int = 100) -> list[str]:
        names: list[str] = []
        async for key in self.client.scan_iter(match=self.keys.worker("*"), count=100):
            names.append(key)
            if len(names) >= limit:
                break
        return sorted(names)

    async def model_info(self) -> ModelInfo:
        """The model of a live worker (any: workers behind one stream serve one model)."""
        try:
            names = await bounded(self._workers())
            raw = [v for v in (await bounded(self.client.mget(names)) if names else []) if v]
        except RedisError as exc:
            raise unavailable(exc) from None
        if not raw:
            raise ServiceError(Code.UNAVAILABLE, "queue: no worker is registered (start `ilre worker`)")
        return ModelInfo.from_dict(json.loads(raw[0]))

    async def submit(self, request: CompressRequest, timeout_s: float, caller: KeyPolicy = ANONYMOUS,
                     request_id: str = "") -> CompressResults:
        """Enqueue (RESOURCE_EXHAUSTED when full or past the caller key's limits, UNAVAILABLE when
        Redis is down), await the result. The entry carries the request id and the trace context."""
        rid = uuid.uuid4().hex
        deadline = time.time() + timeout_s
        extra = [request_id, tracing.inject({}).get("traceparent", ""), caller.document_scope]
        for last_try in (False, True):
            try:
                (status, count, wait), replicas = await bounded(
                    self._add(rid, encode_request(request), deadline, caller, extra), CALL_S + self.wait_ms / 1000.0)
            except RedisError as exc:
                self._spawn(self._cancel(rid, deadline))  # it may have been added before the link went silent
                raise unavailable(exc) from None
            if status != 1 or replicas >= self.wait_replicas or last_try or not await self.master.check():
                break
            self._spawn(self._cancel(rid, deadline))  # a WAIT shortfall on a master that was replaced: once more,
            rid = uuid.uuid4().hex                    # on the new one
        if status == 0:
            self._depth = int(count)
            raise ServiceError(Code.RESOURCE_EXHAUSTED,
                               f"queue: {count} requests waiting, the limit is {self.max_depth} (max_queue)")
        if status == 2:
            raise share_refusal(caller, int(count), caller.queue_limit(self.max_depth), self.max_depth)
        if status == 3:
            raise rate_refusal(caller, float(wait))
        self._depth = int(count)
        self.metrics.queue_depth.set(self._depth)
        if replicas < self.wait_replicas:  # not durable: a failover now could lose it, so it is not accepted
            self._spawn(self._cancel(rid, deadline))
            raise ServiceError(Code.UNAVAILABLE, f"queue: the request reached {replicas} Redis replica(s) within "
                                                 f"{self.wait_ms} ms, {self.wait_replicas} needed (redis_wait_replicas); "
                                                 f"not accepted, retry")
        try:
            outcome = decode_outcome(await self._await(rid, deadline, timeout_s))
        except BaseException as exc:
            if not isinstance(exc, ServiceError) or exc.code in (Code.DEADLINE_EXCEEDED, Code.UNAVAILABLE):
                self._spawn(self._cancel(rid, deadline))  # caller gone or gave up: workers drop it
            raise
        for one in outcome.results:  # a worker counted it in its own registry; this is the front end's
            self.metrics.observe_result(one.timings_ms, one.original_tokens, one.compressed_tokens, one.resumed_tokens)
        return outcome

    async def _add(self, rid: str, payload: str, deadline: float, caller: KeyPolicy, extra: list[str]) -> tuple[list, int]:
        """ADMIT -> ([status, count, wait], replicas holding it). With wait_replicas, WAIT runs on the
        same connection (a pipeline), so it counts the replicas that have this very write."""
        keys = [self.keys.stream, self.keys.unfinished(caller.name), self.keys.rate(caller.name)]
        args = [self.max_depth, rid, payload, repr(deadline), caller.name, caller.queue_limit(self.max_depth) or 0,
                caller.rate or 0, caller.burst or 1, repr(time.time()), RESULT_GRACE_S, *extra]
        if not self.wait_replicas:
            return await self._admit(keys=keys, args=args), 0
        async with self.client.pipeline(transaction=False) as pipe:
            await self._admit(keys=keys, args=args, client=pipe)
            pipe.execute_command("WAIT", self.wait_replicas, self.wait_ms)
            admitted, replicas = await pipe.execute()
        return admitted, int(replicas) if admitted[0] == 1 else self.wait_replicas

    async def _await(self, rid: str, deadline: float, timeout_s: float) -> str:
        """BLPOP the result key in chunks until the deadline; ride out Redis outages up to retry_s. Redis is
        counted lost from the last reply heard (a chunk's wait aside), each call bounded, so a caller hears of
        an outage within retry_s + CALL_S + BLOCK_CHUNK_S whatever the sockets do."""
        last_heard = time.monotonic()
        while (remaining := deadline - time.time()) > 0:
            chunk = max(0.01, min(remaining, BLOCK_CHUNK_S))
            try:
                item = await bounded(self.client.blpop([self.keys.result(rid)], timeout=chunk), chunk + 1.0)
                last_heard = time.monotonic()
            except RedisError as exc:
                self.metrics.redis_retries.labels("result").inc()
                if time.monotonic() - last_heard >= self.retry_s + BLOCK_CHUNK_S:
                    raise ServiceError(Code.UNAVAILABLE, f"queue: Redis is unreachable ({type(exc).__name__}) for "
                                                         f"{time.monotonic() - last_heard:.1f} s while an accepted "
                                                         f"request waits for its result (redis_retry_s "
                                                         f"{self.retry_s:.3g} s); retry later") from None
                await asyncio.sleep(min(0.2, max(remaining, 0)))
                continue
            if item:
                return item[1]
        raise ServiceError(Code.DEADLINE_EXCEEDED, f"deadline: no result within {timeout_s:.3g} s")

    async def _cancel(self, rid: str, deadline: float) -> None:
        ttl = max(1, math.ceil(deadline - time.time())) + RESULT_GRACE_S
        try:
            await bounded(self.client.set(self.keys.cancel(rid), "1", ex=ttl))
        except RedisError:
            pass  # the worker still drops it once its deadline has passed

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        if self._follow is not None:
            self._follow.cancel()
            await asyncio.gather(self._follow, return_exceptions=True)
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        await self.client.aclose()
