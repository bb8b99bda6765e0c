"""Traces and logs of a request, with real parts: spans exported by OTLP/HTTP to a receiver on
loopback (decoded with the protocol's own messages), a worker process exporting its part of the
same trace through Redis, `ilre serve --log-format json` and `ilre worker --log-format json`
writing one line per request with its id and the key's name, never the key."""

from __future__ import annotations

import json
import signal

import grpc
import httpx
import pytest

from ilre.service.common import tracing
from ilre.service.server import ServiceThread
from ilre.service.transport.convert import pb, pb_grpc

from .conftest import QUERY, WorkerProcess, context, service_config, wait_for
from .otlp_receiver import OtlpReceiver, Span
from .test_redis_queue import redis_config
from tests.service.conftest import Served

KEY = "k-trace-5d6e7f8a9b"
CALLER_TRACE, CALLER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
STAGES = ("tokenize", "prefill", "score", "allocate")


@pytest.fixture
def keys_file(tmp_path):
    path = tmp_path / "keys.txt"
    path.write_text(f"{KEY} name=team-t\n")
    return str(path)


def one(spans: list, **where):
    found = [s for s in spans if all(getattr(s, k) == v for k, v in where.items())]
    assert len(found) == 1, (where, found)
    return found[0]


def check_engine_spans(receiver: OtlpReceiver, parent: Span) -> None:
    """ilre.compress under `parent`, each stage under it, laid within it, and the queue wait."""
    compress = one(receiver.named("ilre.compress"), parent_id=parent.span_id)
    for stage in STAGES:
        span = one(receiver.named(stage), parent_id=compress.span_id)
        assert compress.start_ns <= span.start_ns <= span.end_ns <= compress.end_ns
    assert one(receiver.named("queue.wait"), parent_id=parent.span_id).end_ns <= compress.start_ns + 1


def test_a_request_is_one_trace_with_its_stages_and_its_id_comes_back(engine, otlp, keys_file):
    receiver = otlp
    with ServiceThread(service_config(api_keys_file=keys_file), engine) as svc:
        reply = httpx.post(f"http://127.0.0.1:{svc.http_port}/v1/compress", timeout=120,
                           json={"context": context(2), "query": QUERY, "budget": 16},
                           headers={"authorization": f"Bearer {KEY}", "x-request-id": "req-123",
                                    "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
        bad = httpx.post(f"http://127.0.0.1:{svc.http_port}/v1/compress", timeout=30, json={},
                         headers={"authorization": f"Bearer {KEY}", "x-request-id": "no spaces allowed"})
        with grpc.insecure_channel(f"127.0.0.1:{svc.grpc_port}") as channel:
            _, call = pb_grpc.CompressorStub(channel).Compress.with_call(
                pb.CompressRequest(context=context(3), query=QUERY, budget=16), metadata=(("authorization", f"Bearer {KEY}"),))
        grpc_id = dict(call.trailing_metadata())["x-request-id"]
        tracing.flush()
    assert reply.status_code == 200 and reply.headers["x-request-id"] == "req-123"
    assert bad.status_code == 400 and bad.json()["field"] == "x-request-id"
    assert len(grpc_id) == 32 and int(grpc_id, 16) >= 0  # made by the service, returned in the trailers
    wait_for(lambda: len(receiver.named("allocate")) >= 2, 30, "the spans to arrive")
    request = one(receiver.named("ilre.request"), trace_id=CALLER_TRACE)
    assert request.parent_id == CALLER_SPAN and request.kind == 2  # SERVER, under the caller's span
    assert request.attributes["ilre.request_id"] == "req-123" and request.attributes["ilre.key"] == "team-t"
    assert request.attributes["ilre.code"] == "OK" and request.attributes["ilre.compressed_tokens"] == 16
    queue = one(receiver.named("ilre.queue"), parent_id=request.span_id)
    check_engine_spans(receiver, queue)
    by_grpc = [s for s in receiver.named("ilre.request") if s.attributes["ilre.request_id"] == grpc_id]
    assert len(by_grpc) == 1 and by_grpc[0].attributes["rpc.method"] == "grpc.Compress"
    assert not any(KEY.encode() in body for body in receiver.raw)


def test_a_worker_exports_its_part_of_the_trace_and_logs_the_request(redis_server, engine, otlp):
    receiver = otlp
    worker = WorkerProcess(redis_server.url, "traced", "w-traced", "--tracing", "otlp", "--log-format", "json")
    try:
        worker.wait_registered(redis_server.client())
        with ServiceThread(redis_config(redis_server, "traced")) as svc:
            reply = httpx.post(f"http://127.0.0.1:{svc.http_port}/v1/compress", timeout=120,
                               json={"context": context(4), "query": QUERY, "budget": 16})
            tracing.flush()
        rid = reply.headers["x-request-id"]
        assert reply.status_code == 200
        wait_for(lambda: receiver.named("ilre.worker"), 30, "the worker's spans")
    finally:
        worker.proc.send_signal(signal.SIGTERM)  # a graceful stop exports what is buffered
        worker.proc.wait(60)
    request = one(receiver.named("ilre.request"), service="ilre-test")
    queue = one(receiver.named("ilre.queue"), parent_id=request.span_id)
    work = one(receiver.named("ilre.worker"), trace_id=request.trace_id)
    assert work.service == "ilre-worker" and work.parent_id == queue.span_id and work.kind == 5  # CONSUMER
    assert work.attributes["ilre.request_id"] == rid and work.attributes["ilre.worker"] == "w-traced"
    check_engine_spans(receiver, work)
    lines = [json.loads(line) for line in worker.proc.stderr.read().decode().splitlines() if line.startswith("{")]
    mine = [line for line in lines if line.get("request_id") == rid]
    assert len(mine) == 1 and mine[0]["logger"] == "ilre.requests" and mine[0]["method"] == "worker"
    assert mine[0]["code"] == "OK" and mine[0]["key"] == "anonymous" and mine[0]["compressed_tokens"] == 16


def test_serve_writes_one_json_line_per_request_with_the_key_name_never_the_key(keys_file):
    served = Served("--log-format", "json", "--api-keys-file", keys_file)
    try:
        wait_for(served.ready, 120, "the model to load")
        with httpx.Client(base_url=served.http, timeout=120) as http:
            ok = http.post("/v1/compress", json={"context": context(5), "query": QUERY, "budget": 16},
                           headers={"authorization": f"Bearer {KEY}"})
            refused = http.post("/v1/compress", json={"context": "", "query": QUERY},
                                headers={"authorization": f"Bearer {KEY}", "x-request-id": "bad-1"})
        lines = lambda: [json.loads(l) for l in served.lines if l.startswith("{")]  # noqa: E731
        wait_for(lambda: {"bad-1", ok.headers["x-request-id"]} <= {l.get("request_id") for l in lines()}, 30, "the lines")
    finally:
        served.proc.send_signal(signal.SIGTERM)
        served.proc.wait(60)
    by_id = {line.get("request_id"): line for line in lines() if line["logger"] == "ilre.requests"}
    good = by_id[ok.headers["x-request-id"]]
    assert good["key"] == "team-t" and good["code"] == "OK" and good["method"] == "http.compress"
    assert good["compressed_tokens"] == 16 and good["original_tokens"] > 16 and good["queries"] == 1
    assert {"prefill", "score", "allocate", "total"} <= set(good["timings_ms"]) and good["seconds"] > 0
    assert by_id["bad-1"]["code"] == "INVALID_ARGUMENT" and "context" in by_id["bad-1"]["error"]
    assert refused.status_code == 400 and all(set(l) >= {"time", "level", "logger", "message"} for l in lines())
    assert KEY not in "".join(served.lines)
