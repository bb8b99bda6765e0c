"""Asking a document again over the wire: CompressQueries and document_id over real gRPC and HTTP,
NOT_FOUND / 404 naming the field, the cache's counters in /metrics, and the shared tier: a second
query served by another real `ilre worker` process through a real redis-server."""

from __future__ import annotations

import httpx
import pytest

from ilre.contract.messages import CompressRequest
from ilre.service.client import ClientError
from ilre.service.server import ServiceThread

from .conftest import QUERY, WorkerProcess, comparable, context, free_port, grpc_client, http_client, service_config, wait_for
from tests.engine.test_documents import CANDIDATES

QUESTIONS = [QUERY, " Who counts the sacks of flour? The one who counts them is"]


def test_queries_and_document_ids_over_grpc(local_service, engine):
    with grpc_client(local_service) as client:
        many = client.compress_queries(context(3), QUESTIONS, budget=48, id="q")
        assert many.id == "q" and len(many.results) == 2 and len(many.document_id) == 32
        # Two questions over this short context read it to l_R once (Cascade.deep_pays): the wire answers
        # what the engine answers for the same request (tests/engine/test_deepening.py checks those).
        both = engine.compress(CompressRequest(context=context(3), queries=QUESTIONS, budget=48))
        for result, expected in zip(many.results, both.results):
            assert comparable(result) == comparable(expected) and result.document_id == many.document_id
        # With deepening off (the tests' servers) a document's later single questions run the cascade.
        again = client.compress(document_id=many.document_id, query=QUESTIONS[1], budget=48)
        alone = engine.compress(CompressRequest(context=context(3), query=QUESTIONS[1], budget=48))
        assert comparable(again) == comparable(alone)
        single = client.compress_queries(document_id=many.document_id, queries=[QUESTIONS[0]], budget=48)
        first = engine.compress(CompressRequest(context=context(3), query=QUESTIONS[0], budget=48))
        assert comparable(single.results[0]) == comparable(first)
        with pytest.raises(ClientError) as err:
            client.compress(document_id="f" * 32, query=QUERY)
        assert err.value.code == "NOT_FOUND" and err.value.field == "document_id"
        with pytest.raises(ClientError) as err:  # several queries need CompressQueries
            client._call(client._stub.Compress, _request(context=context(3), queries=QUESTIONS), 30)
        assert err.value.code == "INVALID_ARGUMENT" and err.value.field == "queries"


def test_async_client_asks_a_document_again(local_service, engine):
    import asyncio

    from ilre.service.client import AsyncClient

    async def ask():
        async with AsyncClient(f"127.0.0.1:{local_service.grpc_port}", timeout=120) as client:
            many = await client.compress_queries(context(6), QUESTIONS, budget=40)
            again = await client.compress(document_id=many.document_id, query=QUESTIONS[1], budget=40)
            return many, again

    many, again = asyncio.run(ask())
    both = engine.compress(CompressRequest(context=context(6), queries=QUESTIONS, budget=40))
    assert [comparable(r) for r in many.results] == [comparable(r) for r in both.results]
    alone = engine.compress(CompressRequest(context=context(6), query=QUESTIONS[1], budget=40))
    assert comparable(again) == comparable(alone) and again.document_id == many.document_id


def _request(**fields):
    from ilre.service.transport.convert import dict_to_request

    return dict_to_request(fields)


def test_queries_and_document_ids_over_http(local_service, engine):
    with http_client(local_service) as http:
        reply = http.post("/v1/compress", json={"id": 7, "context": context(4), "queries": QUESTIONS, "budget": 40})
        assert reply.status_code == 200
        body = reply.json()
        assert body["id"] == 7 and len(body["results"]) == 2
        doc = body["document_id"]
        again = http.post("/v1/compress", json={"document_id": doc, "query": QUESTIONS[0], "budget": 40}).json()
        alone = engine.compress(CompressRequest(context=context(4), query=QUESTIONS[0], budget=40))
        assert again["kept_indices"] == alone.kept_indices and again["document_id"] == doc
        both = engine.compress(CompressRequest(context=context(4), queries=QUESTIONS, budget=40))
        assert [r["kept_indices"] for r in body["results"]] == [r.kept_indices for r in both.results]
        missing = http.post("/v1/compress", json={"id": "m", "document_id": "e" * 32, "query": QUERY})
        assert missing.status_code == 404
        assert missing.json()["code"] == "NOT_FOUND" and missing.json()["field"] == "document_id"
        metrics = http.get("/metrics").text
    hits = [line for line in metrics.splitlines() if line.startswith('ilre_doc_cache_hits_total{kind="state",tier="local"}')]
    assert hits and float(hits[0].split()[-1]) >= 1
    assert "ilre_doc_cache_bytes" in metrics and 'ilre_doc_cache_evictions_total{cause="own",tier="local"}' in metrics


def _metric(port: int, prefix: str) -> float:
    lines = [l for l in httpx.get(f"http://127.0.0.1:{port}/metrics").text.splitlines() if l.startswith(prefix)]
    return float(lines[0].split()[-1]) if lines else 0.0


def test_a_second_worker_process_serves_a_document_the_first_encoded(redis_server):
    """Worker A encodes the document and stops; worker B, a new process with nothing cached, answers
    a query by document_id from the shared tier (IDs and encoded context) without a prefill."""
    config = service_config(redis_url=redis_server.url, redis_prefix="shared-docs", redis_retry_s=1.0)
    client = redis_server.client()
    ports = [free_port(), free_port()]
    with ServiceThread(config) as front, grpc_client(front) as grpc_api:
        first = WorkerProcess(redis_server.url, "shared-docs", "w-a", "--metrics-port", str(ports[0]))
        try:  # a failing assertion must not leave the worker process running
            first.wait_registered(client)
            result = grpc_api.compress(context(5, repeats=30), QUERY, budget=64, strategy_options=CANDIDATES)
            assert result.original_tokens > 2048 and result.timings_ms["prefill"] > 0
        finally:
            first.stop()
        second = WorkerProcess(redis_server.url, "shared-docs", "w-b", "--metrics-port", str(ports[1]))
        try:
            second.wait_registered(client)
            wait_for(lambda: not client.exists("shared-docs:worker:w-a"), 30, "w-a to deregister")
            again = grpc_api.compress(document_id=result.document_id, query=QUERY, budget=64, strategy_options=CANDIDATES)
            assert comparable(again) == comparable(result)
            assert _metric(ports[1], 'ilre_doc_cache_hits_total{kind="ids",tier="shared"}') == 1
            assert _metric(ports[1], 'ilre_doc_cache_hits_total{kind="state",tier="shared"}') == 1
            assert _metric(ports[1], 'ilre_doc_cache_misses_total{kind="state",tier="shared"}') == 0
            exported = httpx.get(f"http://127.0.0.1:{ports[1]}/metrics").text.splitlines()
            assert "ilre_doc_cache_shared_skipped_total 0.0" in exported  # Redis answered every call
            many = grpc_api.compress_queries(document_id=result.document_id, queries=QUESTIONS, budget=64,
                                             strategy_options=CANDIDATES)
            assert many.document_id == result.document_id and comparable(many.results[0]) == comparable(result)
        finally:
            second.stop()
