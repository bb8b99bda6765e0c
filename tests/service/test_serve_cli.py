"""`ilre serve`, `ilre compress --server` and `ilre worker` as a user runs them: real processes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading

import httpx
import pytest

from .conftest import QUERY, context, wait_for

ILRE = [sys.executable, "-m", "ilre.service.cli"]


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
        grpc_port, http_port = re.search(r"gRPC on [\d.]+:(\d+).*//[\d.]+:(\d+)", line).groups()
        self.grpc, self.http = f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{http_port}"

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)

    def _died(self):
        if self.proc.poll() is not None:
            raise AssertionError("serve exited: " + "".join(self.lines))

    def ready(self) -> bool:
        return httpx.get(f"{self.http}/readyz").status_code == 200


@pytest.fixture(scope="module")
def served():
    served = Served("--budget", "48")
    wait_for(served.ready, 120, "the model to load")
    yield served
    if served.proc.poll() is None:
        served.proc.send_signal(signal.SIGTERM)
        served.proc.wait(60)


def compress(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*ILRE, "compress", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_compress_server_equals_local(served):
    remote = compress("--server", served.grpc, "--context", context(3), "--query", QUERY, "--budget", "40", "--json")
    local = compress("--context", context(3), "--query", QUERY, "--budget", "40", "--json")
    assert remote.returncode == 0 == local.returncode, remote.stderr + local.stderr
    strip = lambda r: {k: v for k, v in json.loads(r.stdout).items() if k != "timings_ms"}  # noqa: E731
    assert strip(remote) == strip(local)


def test_serve_defaults_apply_and_text_output(served):
    proc = compress("--server", served.grpc, "--context", context(4), "--query", QUERY)
    assert proc.returncode == 0 and "kept 48 of" in proc.stderr  # `serve --budget 48`


def test_compress_server_errors_are_one_line(served):
    proc = compress("--server", served.grpc, "--context", context(4), "--query", QUERY, "--layer", "99")
    assert proc.returncode == 2 and proc.stderr.strip() == "error: layer: must be in 1..30 (got 99)"
    proc = compress("--server", "127.0.0.1:1", "--context", "abc", "--query", "q", "--timeout", "5")
    assert proc.returncode == 2 and "error: server 127.0.0.1:1: UNAVAILABLE" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_settings_fail_fast_with_one_line():
    for args, message in ((["serve", "--max-batch", "0"], "error: max_batch: must be >= 1 (got 0)"),
                          (["serve", "--tls-cert", "x.pem"], "error: tls_cert: give both tls_cert and tls_key"),
                          (["worker"], "error: redis-url: a worker needs --redis-url")):
        proc = subprocess.run([*ILRE, *args], capture_output=True, text=True, timeout=120,
                              env={k: v for k, v in os.environ.items() if not k.startswith("ILRE_")})
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_sigterm_lets_the_call_in_flight_finish():
    served = Served("--shutdown-grace", "300")
    wait_for(served.ready, 120, "the model to load")
    long = context(0, 200)  # ~20K tokens: seconds in flight on any CPU, so the poll below cannot miss the window
    with httpx.Client(base_url=served.http, timeout=300) as http:
        call = threading.Thread(target=lambda: results.append(
            http.post("/v1/compress", json={"context": long, "query": QUERY, "budget": 64})))
        results: list[httpx.Response] = []
        call.start()
        wait_for(lambda: "ilre_queue_depth 1.0" in http.get("/metrics").text, 60, "the call to be in flight", 0.05)
        served.proc.send_signal(signal.SIGTERM)
        call.join(300)
    assert served.proc.wait(300) == 0
    assert results and results[0].status_code == 200 and results[0].json()["compressed_tokens"] == 64
    assert any("shutting down" in line for line in served.lines)
