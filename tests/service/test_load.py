"""A bounded load test: 32 concurrent clients, every answer checked against the engine, zero
errors, in-process and through Redis with two `ilre worker` processes. (Throughput and latency
are printed by bench/service_bench.py; nothing here is timed.)"""

from __future__ import annotations

import asyncio

import pytest

from ilre.contract.messages import CompressRequest
from ilre.engine.engine import Engine, EngineConfig
from ilre.service.client import AsyncClient
from ilre.service.server import ServiceThread

from ..conftest import DTYPE, shallow_profile
from .conftest import QUERY, WorkerProcess, comparable, context, service_config

CLIENTS, PER_CLIENT = 32, 2  # each client sends its next request once answered
REQUESTS = [dict(context=context(i, 2), query=QUERY, budget=32 + 4 * i, strategy=("ilre", "snapkv")[i % 2])
            for i in range(8)]


def answers(engine) -> list[dict]:
    return [comparable(engine.compress(CompressRequest(**r))) for r in REQUESTS]


@pytest.fixture(scope="module")
def wanted(engine):
    """The answers of `ilre worker` processes (the stored profile)."""
    return answers(engine)


@pytest.fixture(scope="module")
def wanted_shallow(shallow_engine):
    """The answers of the in-process services, which run on the shallow calibration (tests/conftest.py): the load,
    not the profile's selections, is their point."""
    return answers(shallow_engine)


def run_load(target: str) -> list[tuple[int, object]]:
    """CLIENTS clients (one channel each) x PER_CLIENT requests; (request index, result or error)."""

    async def one_client(n: int) -> list[tuple[int, object]]:
        out = []
        async with AsyncClient(target, timeout=600) as client:
            for k in range(PER_CLIENT):
                i = (n + k) % len(REQUESTS)
                try:
                    out.append((i, await client.compress(**REQUESTS[i])))
                except Exception as exc:  # collected, then asserted on: zero errors
                    out.append((i, exc))
        return out

    async def main():
        return [item for chunk in await asyncio.gather(*(one_client(n) for n in range(CLIENTS))) for item in chunk]

    return asyncio.run(main())


def check(outcomes, wanted) -> None:
    errors = [o for _, o in outcomes if isinstance(o, Exception)]
    assert not errors, errors[:3]
    assert len(outcomes) == CLIENTS * PER_CLIENT
    for i, result in outcomes:
        assert comparable(result) == wanted[i]


def test_load_in_process(shallow_engine, wanted_shallow):
    with ServiceThread(service_config(max_queue=64), shallow_engine) as svc:
        check(run_load(f"127.0.0.1:{svc.grpc_port}"), wanted_shallow)
        assert svc.service.metrics.errors.collect()[0].samples == []


def test_load_in_process_with_batched_prefill(wanted_shallow):
    # short requests of one queue batch share a prefill (batch_tokens on, the default on GPUs):
    # every answer is still exactly the one-by-one answer
    batched = Engine(EngineConfig(dtype=DTYPE, batch_tokens=16384), profile=shallow_profile())  # as the shallow engine
    with ServiceThread(service_config(max_queue=64, max_batch=16, max_wait_ms=20.0), batched) as svc:
        check(run_load(f"127.0.0.1:{svc.grpc_port}"), wanted_shallow)
        sizes = {s.name: s.value for s in svc.service.metrics.batch_size.collect()[0].samples}
        assert sizes["ilre_batch_size_sum"] > sizes["ilre_batch_size_count"]  # batches of more than one ran


def test_load_through_redis(redis_server, wanted):
    # one worker batches its short requests into one prefill, the other runs them one by one
    workers = [WorkerProcess(redis_server.url, "load", f"w{n}", "--max-batch", "8", "--batch-tokens", str(16384 * n))
               for n in range(2)]
    try:
        for worker in workers:
            worker.wait_registered(redis_server.client())
        with ServiceThread(service_config(redis_url=redis_server.url, redis_prefix="load", max_queue=64)) as svc:
            check(run_load(f"127.0.0.1:{svc.grpc_port}"), wanted)
            assert svc.service.metrics.errors.collect()[0].samples == []
        assert redis_server.client().xlen("load:requests") == 0
    finally:
        for worker in workers:
            worker.stop()
