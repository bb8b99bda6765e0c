"""Bad input of every field, through gRPC and the HTTP mirror: the documented status code and a
message naming the field and the limit. Deadlines, the bounded queue and callers that go away."""

from __future__ import annotations

import contextlib
import threading

import grpc
import pytest

from ilre.compressor.prefill_config import PrefillConfig
from ilre.engine.engine import Engine, EngineConfig
from ilre.service.client import AsyncClient, Client, ClientError
from ilre.service.server import ServiceThread
from ilre.service.transport.convert import pb, pb_grpc

from .conftest import QUERY, grpc_client, http_client, service_config, wait_for
from tests.shallow import engine_on_shallow_calibration  # noqa: F401 (engine: a flow, on the shallow calibration)


SHORT = "The grass is green. The sky is blue. The vault code is 4471. The sun is yellow. " * 3  # ~60 tokens
LIMITS = dict(max_context_tokens=100, max_query_tokens=20)


@pytest.fixture(scope="module")
def strict_service():
    """Small limits everywhere: 100 context tokens, 20 query tokens, 64 KiB messages, queue of 1."""
    engine = Engine(EngineConfig(prefill=PrefillConfig(), **LIMITS))
    config = service_config(max_message_bytes=65536, max_context_bytes=2000, max_context_tokens=100, max_queue=1)
    with ServiceThread(config, engine) as svc:
        yield svc


@pytest.fixture(scope="module")
def client(strict_service):
    with grpc_client(strict_service) as c:
        yield c


@pytest.fixture(scope="module")
def http(strict_service):
    with http_client(strict_service) as h:
        yield h


LONG = "word " * 150
# (request fields, field named, message fragment, representable in the protobuf message)
BAD = [
    ({"query": QUERY}, "context", "context: is required", True),
    ({"context": "", "query": QUERY}, "context", "context: must not be empty", True),
    ({"context_ids": [], "query": QUERY}, "context_ids", "context_ids: must not be empty", True),
    ({"context_ids": [1, -1], "query": QUERY}, "context_ids", "context_ids: token id -1 outside the vocabulary 0..49151", True),
    ({"context_ids": [10 ** 9], "query": QUERY}, "context_ids", "outside the vocabulary 0..49151", True),
    ({"context": LONG, "query": QUERY}, "context", "tokens exceed the limit of 100 (max_context_tokens)", True),
    ({"context": SHORT}, "query", "query: is required", True),
    ({"context": SHORT, "query": ""}, "query", "query: must not be empty", True),
    ({"context": SHORT, "query_ids": [70000]}, "query_ids", "query_ids: token id 70000 outside the vocabulary", True),
    ({"context": SHORT, "query": "why " * 30}, "query", "tokens exceed the limit of 20 (max_query_tokens)", True),
    ({"context": SHORT, "query": QUERY, "budget": 0}, "budget", "budget: must be a positive integer (got 0)", True),
    ({"context": SHORT, "query": QUERY, "budget": -5}, "budget", "budget: must be a positive integer (got -5)", True),
    ({"context": SHORT, "query": QUERY, "ratio": 0.0}, "ratio", "ratio: must be a number in (0, 1] (got 0.0)", True),
    ({"context": SHORT, "query": QUERY, "ratio": 1.5}, "ratio", "ratio: must be a number in (0, 1] (got 1.5)", True),
    ({"context": SHORT, "query": QUERY, "strategy": "magic"}, "strategy", "strategy: unknown strategy 'magic'", True),
    ({"context": SHORT, "query": QUERY, "strategy_options": {"colour": 1}}, "strategy_options.colour",
     "strategy_options.colour: cascade does not take colour", True),
    ({"context": SHORT, "query": QUERY, "strategy_options": {"candidates": 0.5}}, "strategy_options.candidates",
     "strategy_options.candidates: must be a number >= 1, the candidate set as a multiple of the budget (got 0.5)", True),
    ({"context": SHORT, "query": QUERY, "strategy_options": {"coarse_layer": 19}}, "strategy_options.coarse_layer",
     "strategy_options.coarse_layer: must be below l_R = 19", True),
    ({"context": SHORT, "query": QUERY, "strategy": "snapkv", "strategy_options": {"kernel_size": 0}},
     "strategy_options.kernel_size", "strategy_options.kernel_size: must be an integer >= 1 (got 0)", True),
    ({"context": SHORT, "query": QUERY, "dca": "sometimes"}, "dca", "dca: must be one of auto, on, off", True),
    ({"context": SHORT, "query": QUERY, "granularity": "sentence"}, "granularity",
     "granularity: must be one of token, unit (got 'sentence')", True),
    ({"context": SHORT, "query": QUERY, "layer": 0}, "layer", "layer: must be a positive integer or a profile's layer name (got 0)", True),
    ({"context": SHORT, "query": QUERY, "layer": 99}, "layer", "layer: must be in 1..30 (got 99)", True),
    # JSON only: the protobuf types and oneofs rule these out on the wire
    ({"context": SHORT, "context_ids": [1], "query": QUERY}, "context", "give either context or context_ids", False),
    ({"context": SHORT, "query": QUERY, "budget": 8, "ratio": 0.5}, "budget", "give either budget or ratio", False),
    ({"context": SHORT, "query": QUERY, "budget": "8"}, "budget", "budget: must be a positive integer (got '8')", False),
    ({"context": SHORT, "query": QUERY, "budget": True}, "budget", "budget: must be a positive integer (got True)", False),
    ({"context": SHORT, "query": QUERY, "ratio": "half"}, "ratio", "ratio: must be a number in (0, 1]", False),
    ({"context": 42, "query": QUERY}, "context", "context: must be a string", False),
    ({"context_ids": "1 2 3", "query": QUERY}, "context_ids", "context_ids: must be a list of integer token ids", False),
    ({"context": SHORT, "query": QUERY, "strategy_options": [1]}, "strategy_options", "strategy_options: must be an object", False),
    ({"context": SHORT, "query": QUERY, "colour": "red"}, "colour", "colour: unknown field", False),
    ({"context": SHORT, "query": QUERY, "id": [1]}, "id", "id: must be a string or an integer", False),
    ({"context": SHORT, "query": QUERY, "layer": 2.5}, "layer", "layer: must be a positive integer or a profile's layer name (got 2.5)", False),
]


@pytest.mark.parametrize("data, field, message, wire", BAD, ids=[b[2][:40] for b in BAD])
def test_bad_input_over_http(http, data, field, message, wire):
    reply = http.post("/v1/compress", json=data)
    assert reply.status_code == 400, reply.text
    body = reply.json()
    assert body["code"] == "INVALID_ARGUMENT" and body["field"] == field
    assert message in body["error"] and body["error"].startswith(field + ":")
    assert "Traceback" not in reply.text


@pytest.mark.parametrize("data, field, message, wire", [b for b in BAD if b[3]], ids=[b[2][:40] for b in BAD if b[3]])
def test_bad_input_over_grpc(client, data, field, message, wire):
    with pytest.raises(ClientError) as err:
        client.compress(**data)
    assert err.value.code == "INVALID_ARGUMENT" and err.value.field == field
    assert message in err.value.message and err.value.message.startswith(field + ":")


def test_malformed_http_bodies(http):
    cases = [(b"{not json", 400, "request: not valid JSON"), (b"[1, 2]", 400, "request: must be a JSON object"),
             (b"\xff\xfe", 400, "request: not valid UTF-8"),
             (b'{"context": "' + b"a" * 70000 + b'"}', 413, "request: body exceeds the limit of 65536 bytes (max_message_bytes)")]
    for body, status, message in cases:
        reply = http.post("/v1/compress", content=body, headers={"content-type": "application/json"})
        assert reply.status_code == status and message in reply.json()["error"], reply.text
    reply = http.post("/v1/compress", json={"context": SHORT, "query": QUERY}, headers={"x-request-timeout": "soon"})
    assert reply.status_code == 400 and reply.json()["field"] == "x-request-timeout"


def test_grpc_message_over_the_limit_is_resource_exhausted(client):
    with pytest.raises(ClientError) as err:
        client.compress("a" * 70000, QUERY)
    assert err.value.code == "RESOURCE_EXHAUSTED" and "larger than max" in err.value.message


def _stream(strict_service, parts):
    with grpc.insecure_channel(f"127.0.0.1:{strict_service.grpc_port}") as channel:
        return pb_grpc.CompressorStub(channel).CompressStream(iter(parts), timeout=60)


@pytest.mark.parametrize("parts, field, message", [
    ([], "request", "request: CompressStream received no messages"),
    ([pb.CompressStreamRequest(context_text="abc")], "request", "the first CompressStream message must carry the request"),
    ([pb.CompressStreamRequest(request=pb.CompressRequest(query="q")),
      pb.CompressStreamRequest(request=pb.CompressRequest(query="q"))], "request", "only the first CompressStream message"),
    ([pb.CompressStreamRequest(request=pb.CompressRequest(query="q")), pb.CompressStreamRequest()],
     "part", "must carry context_text or context_ids"),
    ([pb.CompressStreamRequest(request=pb.CompressRequest(query="q", context="abc")),
      pb.CompressStreamRequest(context_ids=pb.TokenIds(ids=[1]))], "context_ids", "give either context or context_ids"),
    ([pb.CompressStreamRequest(request=pb.CompressRequest(query="q"))] +
     [pb.CompressStreamRequest(context_text="x" * 1000)] * 3, "context",
     "streamed context exceeds the limit of 2000 bytes (max_context_bytes)"),
    ([pb.CompressStreamRequest(request=pb.CompressRequest(query="q"))] +
     [pb.CompressStreamRequest(context_ids=pb.TokenIds(ids=[1] * 60))] * 2, "context_ids",
     "more than 100 tokens exceed the limit (max_context_tokens)"),
])
def test_bad_streams(strict_service, parts, field, message):
    with pytest.raises(grpc.RpcError) as err:
        _stream(strict_service, parts)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details() and err.value.details().startswith(field + ":")
    assert dict(err.value.trailing_metadata())["ilre-field"] == field


@contextlib.contextmanager
def engine_held(svc: ServiceThread):
    """Occupy the service's engine thread (white box: its one-thread executor) until the block ends,
    so that queued requests stay queued for as long as a test needs."""
    gate = threading.Event()
    busy = svc.service.frontend.queue._executor.submit(gate.wait)
    try:
        yield
    finally:
        gate.set()
        busy.result()


def _dropped(svc: ServiceThread) -> float:
    return svc.service.metrics.dropped._value.get()


def test_deadline_exceeded_and_the_queued_work_is_dropped(strict_service, client, http):
    dropped = _dropped(strict_service)
    with engine_held(strict_service):
        with pytest.raises(ClientError) as err:
            client.compress(SHORT, QUERY, budget=16, timeout=0.5)
        assert err.value.code == "DEADLINE_EXCEEDED"
        # the server's own timer for that call may fire a moment after the client's: until it has,
        # the abandoned job still holds the only queue slot (max_queue 1)
        wait_for(lambda: strict_service.service.frontend.queue._depth() == 0, 30, "the abandoned call to free its slot")
        reply = http.post("/v1/compress", json={"context": SHORT, "query": QUERY}, headers={"x-request-timeout": "0.5"})
        assert reply.status_code == 504 and reply.json()["code"] == "DEADLINE_EXCEEDED"
        assert reply.json()["error"] == "deadline: no result within 0.5 s"
    # the batch loop drops the abandoned job instead of running it
    wait_for(lambda: _dropped(strict_service) >= dropped + 2, 60, "the expired jobs to be dropped")
    reply = http.post("/v1/compress", json={"context": SHORT, "query": QUERY, "budget": 16},
                      headers={"x-request-timeout": "120"})
    assert reply.status_code == 200  # the service is fine afterwards


def test_bounded_queue_is_resource_exhausted(strict_service, http):
    """max_queue 1: while one request waits, the next is refused at once."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        with engine_held(strict_service):
            first = pool.submit(http.post, "/v1/compress", json={"context": SHORT, "query": QUERY, "budget": 16})
            wait_for(lambda: strict_service.service.frontend.queue._depth() == 1, 60, "the first request to queue")
            with Client(f"127.0.0.1:{strict_service.grpc_port}") as c, pytest.raises(ClientError) as err:
                c.compress(SHORT, QUERY, budget=16)
            second = http.post("/v1/compress", json={"context": SHORT, "query": QUERY, "budget": 16})
        assert err.value.code == "RESOURCE_EXHAUSTED"
        assert "the limit is 1 (max_queue)" in err.value.message
        assert second.status_code == 429 and second.json()["code"] == "RESOURCE_EXHAUSTED"
        assert first.result().status_code == 200  # the accepted one still gets its answer


def test_a_caller_that_goes_away_has_its_queued_work_dropped(strict_service):
    import asyncio

    tokens_before = strict_service.service.metrics.tokens_in._value.get()
    dropped = _dropped(strict_service)

    async def call_and_cancel():
        async with AsyncClient(f"127.0.0.1:{strict_service.grpc_port}") as c:
            call = asyncio.ensure_future(c.compress(SHORT, QUERY, budget=16))
            for _ in range(3000):  # until the server holds it (bounded)
                if strict_service.service.frontend.queue._depth() == 1:
                    break
                await asyncio.sleep(0.02)
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await call

    with engine_held(strict_service):
        asyncio.run(call_and_cancel())
        wait_for(lambda: strict_service.service.frontend.queue._depth() == 0, 30, "the server to see the cancel")
    wait_for(lambda: _dropped(strict_service) >= dropped + 1, 60, "the cancelled job to be dropped")
    assert strict_service.service.metrics.tokens_in._value.get() == tokens_before  # never ran
