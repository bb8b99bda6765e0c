"""Where `ilre batch` sends its requests: one contract request in, its results out (formats.Run), the same for
every backend, so a line is compressed the same way wherever it runs.

- `LocalBackend`: the engine in this process behind the service's own batching queue (queue/local.py): the lines
  in flight share batched prefills (`Engine.compress_many`) and the document cache.
- `RedisBackend`: the worker pool behind a Redis queue (`ilre worker` processes on any host), as `ilre serve
  --redis-url` reaches it.
- `ServerBackend`: one or several running services (`ilre serve`): http(s)://HOST:PORT on the JSON mirror
  (`POST /v1/compress`), HOST:PORT on gRPC; lines go round robin, each line's requests to one of them.

Each retries what a restart or a failover refused (UNAVAILABLE, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED), with a
growing pause, for `retry_s`; past that the ServiceError stops the run (every finished line kept).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any, Awaitable, Callable

import httpx

from ...contract.messages import CompressResults
from ...engine.engine import Engine
from ...service.client import AsyncClient, ClientError
from ...service.common.config import ServiceConfig
from ...service.common.errors import Code, HTTP_STATUS, ServiceError
from ...service.common.metrics import Metrics
from ...service.queue.local import LocalQueue
from ...service.queue.redis_stream import RedisQueue
from ...service.transport.frontend import Frontend

RETRIED = (Code.UNAVAILABLE, Code.RESOURCE_EXHAUSTED, Code.DEADLINE_EXCEEDED)
FIRST_PAUSE_S, MAX_PAUSE_S = 0.2, 5.0
METHOD = "batch"  # the method name the service counts batch requests under


class Backend:
    """One contract request -> its results, retried as the module docstring says; `close()` when done."""

    def __init__(self, timeout_s: float, retry_s: float):
        self.timeout_s, self.retry_s = timeout_s, retry_s
        self.retries = 0  # requests sent again after a refusal

    def line_runner(self) -> Callable[[dict[str, Any]], Awaitable[CompressResults]]:
        """What one input line's requests go through (all of them to one target: `ServerBackend`)."""
        return self.run

    async def run(self, fields: dict[str, Any], once: Callable[[dict[str, Any]], Awaitable[CompressResults]] | None
                  = None) -> CompressResults:
        """One request (through `once`, default `_once`), retried as the module docstring says."""
        give_up, pause = time.monotonic() + self.retry_s, FIRST_PAUSE_S
        while True:
            try:
                return await (once or self._once)(fields)
            except ServiceError as exc:
                if exc.code not in RETRIED or time.monotonic() + pause > give_up:
                    raise
            self.retries += 1
            await asyncio.sleep(pause)
            pause = min(pause * 2, MAX_PAUSE_S)

    async def _once(self, fields: dict[str, Any]) -> CompressResults:
        raise NotImplementedError

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass


class _FrontendBackend(Backend):
    """A backend through the service's own front end, over one of its queues."""

    def __init__(self, queue: Any, metrics: Metrics, timeout_s: float, retry_s: float):
        super().__init__(timeout_s, retry_s)
        self.frontend = Frontend(queue, metrics, ServiceConfig())

    async def start(self) -> None:
        await self.frontend.queue.start()

    async def _once(self, fields: dict[str, Any]) -> CompressResults:
        return await self.frontend.compress(fields, self.timeout_s, METHOD)

    async def close(self) -> None:
        await self.frontend.queue.close()


class LocalBackend(_FrontendBackend):
    """The engine in this process; `max_batch` requests share a batch (max_depth: the lines in flight)."""

    def __init__(self, engine: Engine, in_flight: int, timeout_s: float, retry_s: float, max_batch: int = 8):
        metrics = Metrics()
        super().__init__(LocalQueue(engine, metrics, max_batch=max_batch, max_depth=max(in_flight * 4, 256)),
                         metrics, timeout_s, retry_s)


class RedisBackend(_FrontendBackend):
    """The worker pool behind the Redis queue at `url` (its key `prefix`)."""

    def __init__(self, url: str, prefix: str, in_flight: int, timeout_s: float, retry_s: float):
        metrics = Metrics()
        super().__init__(RedisQueue(url, metrics, prefix=prefix, max_depth=max(in_flight * 4, 256)), metrics,
                         timeout_s, retry_s)


class ServerBackend(Backend):
    """Running services, round robin: http(s):// URLs on the JSON mirror, HOST:PORT on gRPC."""

    def __init__(self, targets: list[str], api_key: str | None, timeout_s: float, retry_s: float):
        super().__init__(timeout_s, retry_s)
        self.targets, self.api_key = targets, api_key
        self._grpc: list[AsyncClient] = []

    async def start(self) -> None:
        """The connections, made on the running event loop (gRPC's channels belong to one)."""
        auth = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._http = httpx.AsyncClient(timeout=self.timeout_s, headers=auth)
        calls: list[Callable[[dict[str, Any]], Awaitable[CompressResults]]] = []
        for target in self.targets:
            if target.startswith(("http://", "https://")):
                calls.append(self._http_call(target.rstrip("/") + "/v1/compress"))
            else:
                client = AsyncClient(target, timeout=self.timeout_s, api_key=self.api_key)
                self._grpc.append(client)
                calls.append(self._grpc_call(client))
        self._next = itertools.cycle(calls)

    async def _once(self, fields: dict[str, Any]) -> CompressResults:
        return await next(self._next)(fields)

    def line_runner(self) -> Callable[[dict[str, Any]], Awaitable[CompressResults]]:
        """The next target, round robin, for every request of one line (a line's "count, then ask by document_id"
        stays on the service that holds its documents)."""
        call = next(self._next)
        return lambda fields: self.run(fields, call)

    def _http_call(self, url: str) -> Callable[[dict[str, Any]], Awaitable[CompressResults]]:
        async def call(fields: dict[str, Any]) -> CompressResults:
            try:
                reply = await self._http.post(url, json=fields)
            except httpx.HTTPError as exc:  # refused, reset, timed out: the host restarting or cut off
                raise ServiceError(Code.UNAVAILABLE, f"{url}: {type(exc).__name__}: {exc}") from None
            if reply.status_code != 200:
                raise _http_error(url, reply)
            return CompressResults.from_dict(reply.json())
        return call

    def _grpc_call(self, client: AsyncClient) -> Callable[[dict[str, Any]], Awaitable[CompressResults]]:
        async def call(fields: dict[str, Any]) -> CompressResults:
            try:
                if fields.get("queries") is not None or fields.get("document_ids") is not None:
                    return await client.compress_queries(**fields)
                return CompressResults.of_one(await client.compress(**fields))
            except ClientError as exc:
                code = Code(exc.code) if exc.code in Code.__members__ else Code.INTERNAL
                raise ServiceError(code, exc.message, exc.field) from None
        return call

    async def close(self) -> None:
        await self._http.aclose()
        for client in self._grpc:
            await client.close()


def _http_error(url: str, reply: httpx.Response) -> ServiceError:
    """The ServiceError an HTTP error answer stands for: its body's code, message and field (the JSON mirror's
    error shape), else its status (5xx from a proxy in front: unavailable)."""
    try:
        body = reply.json()
        return ServiceError(Code(body["code"]), body["error"], body.get("field"))
    except (ValueError, KeyError, TypeError):
        code = {status: code for code, status in HTTP_STATUS.items()}.get(reply.status_code)
        code = code or (Code.UNAVAILABLE if reply.status_code >= 500 else Code.INTERNAL)
        return ServiceError(code, f"{url}: HTTP {reply.status_code} {reply.text[:200]}")
