"""Service fixtures: real servers on 127.0.0.1 (free ports), a real redis-server per module in its
own temp dir, `ilre worker` processes; one shared Engine (the session `engine` fixture) in-process."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx
import pytest
import redis

from ilre.service.client import Client
from ilre.service.common.config import ServiceConfig
from ilre.service.server import ServiceThread

FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
          "A river runs past the mill and the miller counts his sacks of flour. ")
QUERY = " What is the vault code of the museum? The vault code is"


def context(i: int, repeats: int = 3) -> str:
    """A short haystack (~100 tokens per repeat pair) with fact number i in its middle."""
    return FILLER * repeats + f"The vault code of the museum is {4000 + 37 * i}. " + FILLER * repeats


LINES_QUERY = "Question: what is the value of item 17? Answer:"


def lines_context(n: int = 40) -> str:
    """`n` short lines, each one unit for granularity "unit": "Line N: the value of item N is V.\\n"."""
    return "".join(f"Line {i}: the value of item {i} is {7 * i + 3}.\n" for i in range(1, n + 1))


def assert_whole_lines(text: str, spans: list[list[int]] | None) -> None:
    """`spans` (a unit-granularity result's kept_spans) are ascending [start, end) ranges of `text` (from
    lines_context), each whole lines: starting a line and ending with ".\\n" or at the text's end; only
    the first (the sink's tokens) and one more (cut to fill the budget exactly) may be partial."""
    assert spans, "no kept_spans"
    assert all(0 <= start < end <= len(text) for start, end in spans), spans
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans
    starts_a_line = lambda start: start == 0 or text[start - 1] == "\n"  # noqa: E731
    ends_a_line = lambda start, end: text[start:end].endswith(".\n") or end == len(text)  # noqa: E731
    partial = [(start, end) for start, end in spans if not (starts_a_line(start) and ends_a_line(start, end))]
    assert len([s for s in partial if s != tuple(spans[0])]) <= 1, [text[s:e] for s, e in partial]
    assert len(spans) - len(partial) >= 1, "no whole line kept"


def service_config(environ: dict[str, str] | None = None, **overrides) -> ServiceConfig:
    """Loopback, free ports, short grace; only `environ` is consulted, never os.environ."""
    base = dict(host="127.0.0.1", grpc_port=0, http_port=0, shutdown_grace_s=2.0, max_wait_ms=2.0)
    return ServiceConfig.from_env(environ or {}, **{**base, **overrides})


def grpc_client(svc: ServiceThread, timeout: float = 120, **kwargs) -> Client:
    """A sync gRPC client of a running service (use as a context manager)."""
    return Client(f"127.0.0.1:{svc.grpc_port}", timeout=timeout, **kwargs)


def http_client(svc: ServiceThread, timeout: float = 120) -> httpx.Client:
    """An HTTP client of a running service's JSON mirror (use as a context manager)."""
    return httpx.Client(base_url=f"http://127.0.0.1:{svc.http_port}", timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float = 60.0, what: str = "condition", interval: float = 0.05):
    """Poll until `predicate()` is truthy (a bound on waiting, not a timing assertion)."""
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"gave up waiting for {what} after {timeout} s")


def comparable(result) -> dict:
    """A result without its timings (which differ from run to run), how much of its prefill was taken on from a
    cached prefix (what the cache held, like the timings) and its document_id (keyed by a secret each process
    holds unless Redis or the configuration gives one: compare ids on their own)."""
    data = result if isinstance(result, dict) else result.to_dict()
    return {k: v for k, v in data.items() if k not in ("timings_ms", "id", "document_id", "resumed_tokens")}


def redis_server_binary() -> str | None:
    """redis-server on PATH, else the one deploy/test-tools.sh put beside this Python (the venv's bin/)."""
    beside = Path(sys.executable).parent / "redis-server"
    return shutil.which("redis-server") or (str(beside) if beside.is_file() else None)


class RedisServer:
    """A real redis-server on a free loopback port with its own directory (AOF on, so a restart
    keeps the stream and the consumer group, as a production Redis would)."""

    def __init__(self, directory: Path, *extra: str):
        self.binary = redis_server_binary()
        if self.binary is None:
            pytest.fail("redis-server not found: `make tools` installs one (deploy/test-tools.sh)")
        self.dir, self.port, self.extra = directory, free_port(), extra
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--protected-mode", "no", *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        wait_for(lambda: _pings(client), 20, "redis-server to answer")
        client.close()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(20)

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


class WorkerProcess:
    """`ilre worker` in its own process (so that it can be killed with SIGKILL)."""

    def __init__(self, redis_url: str, prefix: str, name: str, *extra: str):
        self.name, self.prefix = name, prefix
        env = {**os.environ, "ILRE_REDIS_URL": redis_url}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ilre.cli", "worker", "--redis-prefix", prefix, "--name", name,
             "--threads", "1", *extra], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def wait_registered(self, client: redis.Redis, timeout: float = 120.0) -> None:
        def registered():
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited: {self.proc.stderr.read().decode()[-2000:]}")
            return client.exists(f"{self.prefix}:worker:{self.name}")
        wait_for(registered, timeout, f"worker {self.name} to register", interval=0.2)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(20)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="module")
def local_service(engine) -> Iterator[ServiceThread]:
    """The in-process service on the shared engine."""
    with ServiceThread(service_config(), engine) as svc:
        yield svc


class WorkerThread:
    """A `Worker` on its own event loop in a thread of this process (shares the session engine)."""

    def __init__(self, engine, config: ServiceConfig, name: str = "in-process"):
        import threading

        self.engine, self.config, self.name = engine, config, name
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import asyncio

        from ilre.service.worker import Worker

        async def main() -> None:
            self.loop, self.stop_event = asyncio.get_running_loop(), asyncio.Event()
            self.worker = Worker(self.engine, self.config, name=self.name)
            self._ready.set()
            await self.worker.run(self.stop_event)

        asyncio.run(main())

    def __enter__(self) -> "WorkerThread":
        self._thread.start()
        self._ready.wait()
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.stop_event.set)
        self._thread.join(60)


@pytest.fixture
def otlp(monkeypatch):
    """Tracing on in this process (OTLP/HTTP), exporting to a real receiver on loopback; off after."""
    from ilre.service.common import tracing

    from .otlp_receiver import OtlpReceiver

    receiver = OtlpReceiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.endpoint)
    tracing.setup_tracing("otlp", "ilre-test")
    yield receiver
    tracing.shutdown_tracing()
    receiver.close()


ILRE = [sys.executable, "-m", "ilre.cli"]


class Served:
    """`ilre serve` on free ports; the ports are read from its startup line."""

    def __init__(self, *args: str, env: dict | None = None):
        self.proc = subprocess.Popen([*ILRE, "serve", "--grpc-port", "0", "--http-port", "0", *args],
                                     env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        line = wait_for(lambda: next((l for l in self.lines if l.startswith("ilre: gRPC")), None) or self._died(),
                        120, "the startup line")
        grpc_port, http_port = re.search(r"gRPC on [\d.]+:(\d+), https?://[\d.]+:(\d+)", line).groups()
        self.grpc, self.http = f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{http_port}"

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)

    def _died(self):
        if self.proc.poll() is not None:
            raise AssertionError("serve exited: " + "".join(self.lines))

    def ready(self) -> bool:
        return httpx.get(f"{self.http}/readyz").status_code == 200


@contextmanager
def served_by(*args: str, env: dict | None = None) -> Iterator[Served]:
    """`ilre serve *args` with its model loaded; stopped by SIGTERM on the way out (if still running)."""
    served = Served(*args, env=env)
    wait_for(served.ready, 120, "the model to load")
    try:
        yield served
    finally:
        if served.proc.poll() is None:
            served.proc.send_signal(signal.SIGTERM)
            served.proc.wait(60)
