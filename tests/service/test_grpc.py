"""Every RPC of the in-process service over real gRPC on loopback, health, reflection, and the HTTP
JSON mirror against the same server."""

from __future__ import annotations

import asyncio
import time
from http.client import HTTPConnection

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from ilre.contract.messages import CompressRequest
from ilre.service.client import AsyncClient

from .conftest import (LINES_QUERY, QUERY, assert_whole_lines, comparable, context, grpc_client, http_client,
                       lines_context)
from tests.shallow import engine_on_shallow_calibration  # noqa: F401 (engine: a flow, on the shallow calibration)


CONTRACT = {"id", "token_ids", "kept_indices", "compressed_context", "query", "original_tokens",
            "compressed_tokens", "ratio", "model", "layer", "strategy", "timings_ms"}


@pytest.fixture(scope="module")
def client(local_service):
    with grpc_client(local_service) as c:
        yield c


@pytest.fixture(scope="module")
def http(local_service):
    with http_client(local_service) as h:
        yield h


def test_compress_equals_the_engine(client, engine):
    result = client.compress(context(1), QUERY, budget=64, id="r1")
    expected = engine.compress(CompressRequest(context=context(1), query=QUERY, budget=64))
    assert result.id == "r1"
    assert comparable(result) == comparable(expected)
    assert result.compressed_tokens == len(result.kept_indices) == 64
    assert result.token_ids[:64] == expected.token_ids[:64] and len(result.token_ids) > 64
    assert {"prefill", "score", "allocate", "total", "queue"} <= set(result.timings_ms)
    assert "4037" in result.compressed_context


def test_compress_with_token_ids_ratio_strategy_and_options(client, engine):
    ids = engine.tokenizer(context(2), add_special_tokens=False).input_ids
    query_ids = engine.tokenizer(QUERY, add_special_tokens=False).input_ids
    result = client.compress(ids, query_ids, ratio=0.25, strategy="snapkv", strategy_options={"kernel_size": 3})
    expected = engine.compress(CompressRequest(context_ids=ids, query_ids=query_ids, ratio=0.25, strategy="snapkv",
                                               strategy_options={"kernel_size": 3}))
    assert comparable(result) == comparable(expected)
    assert result.strategy == "snapkv" and result.token_ids[-len(query_ids):] == query_ids


def test_compress_stream_in_pieces_equals_unary(client):
    text = context(3)
    unary = client.compress(text, QUERY, budget=48)
    streamed = client.compress_stream(text, QUERY, budget=48, piece=37)  # many small pieces
    assert comparable(streamed) == comparable(unary)


def test_compress_stream_of_token_ids(client, engine):
    ids = engine.tokenizer(context(4), add_special_tokens=False).input_ids
    streamed = client.compress_stream(ids, QUERY, budget=40, piece=25)
    assert comparable(streamed) == comparable(client.compress(ids, QUERY, budget=40))


def test_granularity_unit_through_every_rpc_and_the_json_mirror(local_service, client, http, engine):
    text = lines_context()
    unary = client.compress(text, LINES_QUERY, budget=60, granularity="unit")
    assert unary.granularity == "unit" and unary.compressed_tokens == 60
    assert_whole_lines(text, unary.kept_spans)
    expected = engine.compress(CompressRequest(context=text, query=LINES_QUERY, budget=60, granularity="unit"))
    assert comparable(unary) == comparable(expected)
    streamed = client.compress_stream(text, LINES_QUERY, budget=60, granularity="unit", piece=100)
    assert comparable(streamed) == comparable(unary)
    questions = [LINES_QUERY, "Question: what is the value of item 33? Answer:"]
    many = client.compress_queries(text, questions, budget=60, granularity="unit")
    both = engine.compress(CompressRequest(context=text, queries=questions, budget=60, granularity="unit"))
    assert [comparable(r) for r in many.results] == [comparable(r) for r in both.results]
    assert_whole_lines(text, many.results[0].kept_spans)
    assert many.results[1].granularity == "unit"
    assert_whole_lines(text, many.results[1].kept_spans)

    async def asynchronously():
        async with AsyncClient(f"127.0.0.1:{local_service.grpc_port}", timeout=120) as c:
            return await c.compress(text, LINES_QUERY, budget=60, granularity="unit")

    assert comparable(asyncio.run(asynchronously())) == comparable(unary)
    reply = http.post("/v1/compress", json={"context": text, "query": LINES_QUERY, "budget": 60, "granularity": "unit"})
    assert reply.status_code == 200, reply.text
    assert comparable(reply.json()) == comparable(unary)  # granularity and kept_spans included

    default = client.compress(text, LINES_QUERY, budget=60)  # the profile's default: whole units
    assert comparable(default) == comparable(unary)
    tokens = client.compress(text, LINES_QUERY, budget=60, granularity="token")  # single tokens, no spans
    assert tokens.granularity == "token" and tokens.kept_spans is None
    reply = http.post("/v1/compress", json={"context": text, "query": LINES_QUERY, "budget": 60, "granularity": "token"})
    assert reply.json()["granularity"] == "token" and "kept_spans" not in reply.json()


def test_get_model_info(client, engine):
    info = client.model_info()
    assert info.model == "SmolLM2-135M-Instruct" == engine.model_name
    assert info.layer == engine.layer and info.num_layers == engine.spec.num_layers
    assert info.vocab_size == engine.spec.vocab_size and "ilre" in info.strategies
    assert info.queue == "local" and info.max_message_bytes == 16 << 20
    assert info.max_context_tokens == engine.config.max_context_tokens
    assert (info.device, info.dtype) == ("cpu", engine.placement.dtype_name)


def test_async_client(local_service, engine):
    async def main():
        async with AsyncClient(f"127.0.0.1:{local_service.grpc_port}", timeout=120) as c:
            results = await asyncio.gather(*(c.compress(context(i), QUERY, budget=32) for i in range(3)))
            streamed = await c.compress_stream(context(0), QUERY, budget=32, piece=100)
            return results, streamed, await c.model_info()

    results, streamed, info = asyncio.run(main())
    for i, result in enumerate(results):
        assert comparable(result) == comparable(engine.compress(CompressRequest(context=context(i), query=QUERY, budget=32)))
    assert comparable(streamed) == comparable(results[0]) and info.model == engine.model_name


def test_health_service(local_service):
    with grpc.insecure_channel(f"127.0.0.1:{local_service.grpc_port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "ilre.v1.Compressor"):
            assert stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status == \
                health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as err:
            stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_and_describes_the_service(local_service):
    with grpc.insecure_channel(f"127.0.0.1:{local_service.grpc_port}") as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        services = set(db.get_services())
        assert {"ilre.v1.Compressor", "grpc.health.v1.Health"} <= services
        file = db.FindFileContainingSymbol("ilre.v1.Compressor")
        assert file.name == "ilre/v1/compressor.proto"
        methods = {m.name for s in file.service for m in s.method}
        assert methods == {"Compress", "CompressQueries", "CompressStream", "GetModelInfo"}
        assert "budget" in {f.name for m in file.message_type if m.name == "CompressRequest" for f in m.field}


def test_json_mirror_equals_grpc(client, http):
    body = {"id": "m1", "context": context(5), "query": QUERY, "budget": 50, "strategy": "ilre"}
    reply = http.post("/v1/compress", json=body)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert CONTRACT <= set(data) and data["id"] == "m1"
    assert comparable(data) == comparable(client.compress(body["context"], QUERY, budget=50, id="m1", strategy="ilre"))


def test_json_mirror_keeps_integer_ids_and_applies_ratio(http):
    reply = http.post("/v1/compress", json={"id": 7, "context": context(6), "query": QUERY, "ratio": 0.5})
    assert reply.status_code == 200 and reply.json()["id"] == 7
    data = reply.json()
    assert data["compressed_tokens"] == -(-data["original_tokens"] // 2)


def test_an_idle_http_connection_outlives_client_pools(local_service):
    """A client pool keeps an idle connection 5 s (httpx); the server must not close it first, or a
    request sent on it just then fails with no answer. One idle for 6 s still answers."""
    conn = HTTPConnection("127.0.0.1", local_service.http_port, timeout=10)

    def health() -> None:
        conn.request("GET", "/healthz")
        reply = conn.getresponse()
        assert reply.status == 200 and reply.read() == b'{"status":"ok"}'
    try:
        health()
        first = conn.sock
        time.sleep(6.0)
        health()
        assert conn.sock is first  # the same connection both times
    finally:
        conn.close()


def test_http_health_ready_model_and_metrics(http, client):
    assert http.get("/healthz").json() == {"status": "ok"}
    ready = http.get("/readyz")
    assert ready.status_code == 200 and ready.json() == {"ready": True, "queue": "local"}
    model = http.get("/v1/model").json()
    assert model["model"] == client.model_info().model and model["queue"] == "local"
    assert model["kernels"] == client.model_info().kernels and set(model["kernels"]) == {"chunk_attention",
                                                                                        "layer_passes"}
    client.compress(context(7), QUERY, budget=30)
    http.post("/v1/compress", json={"context": "", "query": "q"})
    text = http.get("/metrics").text
    for name in ("ilre_requests_total{method=\"grpc.Compress\"}", "ilre_errors_total{code=\"INVALID_ARGUMENT\"}",
                 "ilre_queue_depth", "ilre_batch_size_count", "ilre_request_latency_seconds_bucket",
                 "ilre_queue_wait_seconds_count", "ilre_compress_seconds_count", "ilre_tokens_in_total",
                 "ilre_tokens_out_total", "ilre_ready 1.0"):
        assert name in text, name
    tokens_in = _metric(text, "ilre_tokens_in_total")
    tokens_out = _metric(text, "ilre_tokens_out_total")
    assert tokens_in > tokens_out >= 30


def _metric(text: str, name: str) -> float:
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def test_a_batch_equals_one_by_one(local_service, engine):
    """Concurrent requests are batched (max_batch 8); each result equals its solo run."""
    requests = [dict(context=context(i, 2), query=QUERY, budget=24 + i) for i in range(8)]

    async def main():
        async with AsyncClient(f"127.0.0.1:{local_service.grpc_port}", timeout=300) as c:
            return await asyncio.gather(*(c.compress(r["context"], r["query"], budget=r["budget"]) for r in requests))

    before = local_service.service.metrics.batch_size.collect()[0].samples
    results = asyncio.run(main())
    for request, result in zip(requests, results):
        assert comparable(result) == comparable(engine.compress(CompressRequest(**request)))
    after = local_service.service.metrics.batch_size.collect()[0].samples
    count = {s.name: s.value for s in after}["ilre_batch_size_count"] - {s.name: s.value for s in before}["ilre_batch_size_count"]
    assert count < len(requests)  # at least one batch held more than one request
