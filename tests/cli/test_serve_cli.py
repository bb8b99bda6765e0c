"""`ilre serve`, `ilre compress --server` and `ilre worker` as a user runs them: real processes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading

import httpx
import pytest

from ilre.service.client import Client, ClientError
from tests.service.conftest import (ILRE, LINES_QUERY, QUERY, Served, assert_whole_lines, context, lines_context, served_by,
                       wait_for)

@pytest.fixture(scope="module")
def served():
    with served_by("--budget", "48") as served:
        yield served


def compress(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*ILRE, "compress", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_compress_server_equals_local(served):
    remote = compress("--server", served.grpc, "--context", context(3), "--query", QUERY, "--budget", "40", "--json")
    local = compress("--context", context(3), "--query", QUERY, "--budget", "40", "--json")
    assert remote.returncode == 0 == local.returncode, remote.stderr + local.stderr
    strip = lambda r: {k: v for k, v in json.loads(r.stdout).items() if k not in ("timings_ms", "document_id")}  # noqa: E731
    assert strip(remote) == strip(local)


def test_serve_defaults_apply_and_text_output(served):
    proc = compress("--server", served.grpc, "--context", context(4), "--query", QUERY)
    assert proc.returncode == 0 and "kept 48 of" in proc.stderr  # `serve --budget 48`


def test_granularity_is_sent_by_compress_server_and_a_serve_default():
    text = lines_context()
    local = compress("--context", text, "--query", LINES_QUERY, "--budget", "60", "--granularity", "unit", "--json")
    assert local.returncode == 0, local.stderr
    strip = lambda r: {k: v for k, v in json.loads(r.stdout).items() if k not in ("timings_ms", "document_id")}  # noqa: E731
    assert strip(local)["granularity"] == "unit"
    assert_whole_lines(text, strip(local)["kept_spans"])
    with served_by(env={"ILRE_GRANULARITY": "unit"}) as unit_served:  # the server's default for requests naming none
        remote = compress("--server", unit_served.grpc, "--context", text, "--query", LINES_QUERY, "--budget", "60",
                          "--json", env={"ILRE_GRANULARITY": ""})
        assert remote.returncode == 0, remote.stderr
        assert strip(remote) == strip(local)
        named = compress("--server", unit_served.grpc, "--context", text, "--query", LINES_QUERY, "--budget", "60",
                         "--granularity", "token", "--json")
        assert json.loads(named.stdout)["granularity"] == "token"  # the request's own wins


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
    long = context(0, 50)  # ~5K tokens: seconds in flight on a CPU (every test runs on one), so the poll cannot miss it
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


@pytest.mark.parametrize("command", ["serve", "sidecar"])
def test_api_keys_from_the_environment_guard_each_front_end(command):
    """`ILRE_API_KEYS=a,b ilre serve|sidecar`, as README, compose and k8s configure them: the process starts and
    a call without a key is 401, with either key 200."""
    args = ["--http-port", "0", "--grpc-port", "0"] if command == "serve" else ["--port", "0", "--engine-url", "http://127.0.0.1:9"]
    proc = subprocess.Popen([*ILRE, command, *args], env={**os.environ, "ILRE_API_KEYS": "sk-a,sk-b"},
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert line.startswith("ilre: ") and "API keys on" in line, line
        port = re.search(r"https?://[\d.]+:(\d+)", line).group(1)
        url = f"http://127.0.0.1:{port}" + ("/v1/compress" if command == "serve" else "/ilre/v1/compress")
        body = {"context": context(2), "query": QUERY, "budget": 16}
        wait_for(lambda: httpx.post(url, json=body, headers={"authorization": "Bearer sk-b"}, timeout=60).status_code == 200,
                 120, f"{command} to answer a call with a key", interval=0.5)
        assert httpx.post(url, json=body, timeout=60).status_code == 401
        assert httpx.post(url, json=body, headers={"authorization": "Bearer sk-c"}, timeout=60).status_code == 401
        assert httpx.post(url, json=body, headers={"authorization": "Bearer sk-a"}, timeout=60).status_code == 200
        if command == "serve":  # and its gRPC door
            grpc_port = re.search(r"gRPC on [\d.]+:(\d+)", line).group(1)
            with Client(f"127.0.0.1:{grpc_port}") as anonymous, pytest.raises(ClientError) as refused:
                anonymous.compress(context(2), QUERY, budget=16)
            assert refused.value.code == "UNAUTHENTICATED"
            with Client(f"127.0.0.1:{grpc_port}", api_key="sk-a") as keyed:
                assert keyed.compress(context(2), QUERY, budget=16).compressed_tokens == 16
    finally:
        proc.terminate()
        proc.wait(timeout=60)
