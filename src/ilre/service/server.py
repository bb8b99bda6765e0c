"""`ilre serve`: one front end = a queue + the gRPC server + the HTTP server, with graceful shutdown.

Start: queue (the local queue loads the model in the background) -> gRPC -> HTTP; /healthz answers
at once, /readyz and the gRPC health service turn ready when the model is loaded (or, with Redis,
when Redis answers and a worker is registered).
Stop (SIGTERM/SIGINT): health NOT_SERVING -> both servers stop taking calls and give in-flight ones
shutdown_grace_s -> the queue closes (what is still queued locally fails with UNAVAILABLE).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import ssl
import sys
import threading
from typing import Any, Callable

import uvicorn

from ..engine.engine import Engine
from .common.config import ServiceConfig, SidecarConfig
from .common.errors import ConfigError
from .common.metrics import Metrics
from .queue.local import LocalQueue
from .queue.redis_stream import RedisQueue
from .common.redis_url import parse_redis_url
from .transport.frontend import Frontend
from .transport.grpc_server import build_grpc_server, track_health
from .transport.http_app import build_app
from .sidecar.app import Sidecar, build_sidecar_app
from .sidecar.options import CompressionOptions
from .sidecar.prompt import PromptSplitter

log = logging.getLogger(__name__)


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: Service owns shutdown."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


class Service:
    """A front end. engine: an Engine, or a factory the local queue runs at start (default: the
    embedded model); unused with a Redis URL. defaults: request fields for requests that omit them.
    With `sidecar` (and the compressor's `tokenizer`), the HTTP port serves the engine sidecar
    instead of the JSON mirror (which moves under /ilre/) and no gRPC server runs."""

    def __init__(self, config: ServiceConfig, engine: Engine | Callable[[], Engine] | None = None,
                 defaults: dict[str, Any] | None = None, sidecar: SidecarConfig | None = None,
                 tokenizer: Any = None):
        self.config = config
        self.sidecar_config, self.tokenizer = sidecar, tokenizer
        self.sidecar: Sidecar | None = None
        self.metrics = Metrics()
        if config.redis_url:
            queue: Any = RedisQueue(config.redis_url, self.metrics, prefix=config.redis_prefix,
                                    max_depth=config.max_queue, retry_s=config.redis_retry_s,
                                    wait_replicas=config.wait_replicas, wait_ms=config.redis_wait_ms)
        else:
            queue = LocalQueue(engine or Engine, self.metrics, max_batch=config.max_batch,
                               max_wait_s=config.max_wait_ms / 1000.0, max_depth=config.max_queue,
                               document_secret=config.document_secret)
        self.frontend = Frontend(queue, self.metrics, config, defaults)
        self.grpc_port: int | None = None
        self.http_port: int | None = None
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        cfg = self.config
        await self.frontend.queue.start()
        if self.sidecar_config is not None:
            sidecar = self.sidecar_config
            options = CompressionOptions(query_tokens=sidecar.query_tokens, history=sidecar.history,
                                         retrieve_rounds=sidecar.retrieve_rounds)
            self.sidecar = Sidecar(self.frontend, self.sidecar_config, PromptSplitter(self.tokenizer), options)
            await self.sidecar.start()
            app: Any = build_sidecar_app(self.sidecar)
            self._grpc = self._health = None
        else:
            app = build_app(self.frontend)
            self._grpc, self._health, self.grpc_port = build_grpc_server(self.frontend, cfg)
            await self._grpc.start()
            self._tasks.append(asyncio.create_task(track_health(self.frontend, self._health)))
        sock = _listen(cfg.host, cfg.http_port)
        self.http_port = sock.getsockname()[1]
        tls: dict[str, Any] = {}
        if cfg.tls:
            tls = {"ssl_certfile": cfg.tls_cert, "ssl_keyfile": cfg.tls_key}
            if cfg.tls_client_ca:
                tls.update(ssl_ca_certs=cfg.tls_client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
        self._http = _Uvicorn(uvicorn.Config(app, lifespan="off", log_config=None,
                                             access_log=False, timeout_graceful_shutdown=max(1, int(cfg.shutdown_grace_s)),
                                             timeout_keep_alive=cfg.http_keep_alive_s,  # type: ignore[arg-type]
                                             **tls))
        self._http_task = asyncio.create_task(self._http.serve(sockets=[sock]))
        while not self._http.started:
            if self._http_task.done():
                self._http_task.result()
                raise ConfigError(f"http_port: the HTTP server did not start on {cfg.host}:{self.http_port}")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        """Graceful: no new calls, in-flight ones get shutdown_grace_s, then the queue closes."""
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        for task in self._tasks:
            task.cancel()
        self._http.should_exit = True
        grpc_stop = [self._grpc.stop(self.config.shutdown_grace_s)] if self._grpc is not None else []
        await asyncio.gather(*grpc_stop, self._http_task, *self._tasks, return_exceptions=True)
        if self.sidecar is not None:
            await self.sidecar.close()
        await self.frontend.queue.close()

    async def __aenter__(self) -> "Service":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()


def _listen(host: str, port: int) -> socket.socket:
    """The HTTP listening socket, TCP_NODELAY on: accepted connections inherit it (asyncio sets it
    only on sockets it opened itself). Without it every answer on a kept-alive connection after the
    first waited ~40 ms: the server writes a response's head and body separately, and Nagle holds
    the body until the client's delayed ACK of the head."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family)
    except OSError as exc:
        raise ConfigError(f"http_port: cannot listen on {host}:{port} ({exc.strerror})") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def run_serve(config: ServiceConfig, engine: Engine | Callable[[], Engine] | None = None,
              defaults: dict[str, Any] | None = None, **sidecar: Any) -> int:
    """Serve until SIGTERM/SIGINT, then shut down gracefully (`sidecar`: Service's sidecar arguments)."""

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with Service(config, engine, defaults, **sidecar) as service:
            scheme = "https" if config.tls else "http"
            queue = f"Redis at {parse_redis_url(config.redis_url).redacted()}" if config.redis_url else "in-process"
            if service.sidecar is not None:
                engine_cfg = service.sidecar.config
                where = (f"sidecar on {scheme}://{config.host}:{service.http_port} in front of {engine_cfg.engine_url} "
                         f"({engine_cfg.engine_api} API, forwarding {engine_cfg.forward}; ilre's own endpoints under /ilre/)")
            else:
                where = (f"gRPC on {config.host}:{service.grpc_port}{' (TLS)' if config.tls else ''}, "
                         f"{scheme}://{config.host}:{service.http_port} (/healthz /readyz /metrics /v1/compress)")
            print(f"ilre: {where}; queue {queue}; API keys {'on' if config.api_keys.enabled else 'off'}",
                  file=sys.stderr, flush=True)
            waits = [asyncio.ensure_future(stop.wait())]
            load_failed = getattr(service.frontend.queue, "load_failed", None)
            if load_failed is not None:
                waits.append(asyncio.ensure_future(load_failed.wait()))
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for waiter in waits:
                waiter.cancel()
            if not stop.is_set():
                print(f"error: model: {service.frontend.queue.load_error}", file=sys.stderr, flush=True)
                return 2
            print("ilre: shutting down", file=sys.stderr, flush=True)
        return 0

    return asyncio.run(main())


class ServiceThread:
    """A Service on its own event loop in a background thread (tests, benchmarks, embedding):
    `with ServiceThread(config, engine) as svc: svc.grpc_port ...`."""

    def __init__(self, config: ServiceConfig, engine: Engine | Callable[[], Engine] | None = None,
                 defaults: dict[str, Any] | None = None, **sidecar: Any):
        self.config, self.engine, self.defaults, self.sidecar = config, engine, defaults, sidecar
        self.service: Service | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True, name="ilre-service")

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            async with Service(self.config, self.engine, self.defaults, **self.sidecar) as service:
                self.service = service
                self._started.set()
                await self._stop.wait()
        except BaseException as exc:
            self._error = exc
            self._started.set()

    @property
    def grpc_port(self) -> int:
        return self.service.grpc_port

    @property
    def http_port(self) -> int:
        return self.service.http_port

    def start(self) -> "ServiceThread":
        self._thread.start()
        self._started.wait()
        if self._error:
            raise self._error
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
            self._thread.join()

    def __enter__(self) -> "ServiceThread":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
