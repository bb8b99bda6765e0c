"""The worker (service/worker.py) with a real redis-server: its steps as scripts (FINISH, OWN, DEAD_LETTER), taking
its own entries back when a reply is lost, putting unstarted entries back when it stops, the dtype it runs, a worker
killed with SIGKILL mid-batch, and a request that keeps killing workers dead-lettered."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time

import pytest

from ilre.contract.messages import CompressRequest
from ilre.engine.engine import Engine, EngineConfig
from ilre.service.client import AsyncClient, Client, ClientError
from ilre.service.server import ServiceThread

from .conftest import QUERY, WorkerProcess, WorkerThread, comparable, context, wait_for
from .test_redis_queue import expected, redis_config


def test_a_request_that_keeps_killing_workers_goes_to_the_dead_letters(redis_server, engine):
    """Three earlier deliveries of the entry ended with their worker gone (XCLAIM RETRYCOUNT records
    them as a crashed worker would leave them); the next worker dead-letters it and the caller
    gets INTERNAL instead of waiting for ever."""
    r = redis_server.client()
    with ServiceThread(redis_config(redis_server, "dl")) as svc, Client(f"127.0.0.1:{svc.grpc_port}") as client:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            call = pool.submit(client.compress, context(0), QUERY, budget=16, timeout=120)
            wait_for(lambda: r.xlen("dl:requests") == 1, 30, "the entry")
            (_, [(entry_id, fields)]), = r.xreadgroup("dl:workers", "crashed", {"dl:requests": ">"}, count=1)
            r.xclaim("dl:requests", "dl:workers", "crashed", 0, [entry_id], retrycount=3)
            config = redis_config(redis_server, "dl", claim_idle_ms=200, max_attempts=3)
            with WorkerThread(engine, config, name="survivor"):
                with pytest.raises(ClientError) as err:
                    call.result()
    assert err.value.code == "INTERNAL"
    assert "abandoned after 3 attempts" in err.value.message and "dl:dead-letter" in err.value.message
    (dead_id, dead), = r.xrange("dl:dead-letter")
    assert dead["rid"] == fields["rid"] and dead["entry"] == entry_id and dead["attempts"] == "3"
    assert r.xlen("dl:requests") == 0 and r.xpending("dl:requests", "dl:workers")["pending"] == 0


def test_kill_9_mid_batch_every_request_answered_once(redis_server, engine):
    r = redis_server.client()
    requests = [dict(context=context(i, 2), query=QUERY, budget=16 + i) for i in range(16)]
    wanted = [expected(engine, **q) for q in requests]
    extra = ("--claim-idle-ms", "1500", "--max-batch", "8", "--max-wait-ms", "200")
    doomed, survivor = WorkerProcess(redis_server.url, "kill", "doomed", *extra), WorkerProcess(redis_server.url, "kill", "survivor", *extra)
    try:
        doomed.wait_registered(r)
        survivor.wait_registered(r)
        with ServiceThread(redis_config(redis_server, "kill")) as svc:
            async def main():
                async with AsyncClient(f"127.0.0.1:{svc.grpc_port}", timeout=300) as c:
                    return await asyncio.gather(*(c.compress(q["context"], q["query"], budget=q["budget"], id=str(i))
                                                  for i, q in enumerate(requests)))

            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                calls = pool.submit(asyncio.run, main())
                wait_for(lambda: _owned(r, "kill", "doomed") >= 2, 120, "the doomed worker to hold a batch",
                                   interval=0.01)
                doomed.kill()
                assert _owned(r, "kill", "doomed") >= 1  # it died holding unacknowledged entries
                results = calls.result()
        assert [result.id for result in results] == [str(i) for i in range(16)]
        assert [comparable(result) for result in results] == wanted
        assert r.xlen("kill:requests") == 0 and r.xpending("kill:requests", "kill:workers")["pending"] == 0
        assert not list(r.scan_iter("kill:result:*"))  # no second answer left behind
    finally:
        doomed.stop()
        survivor.stop()


def _owned(r, prefix: str, consumer: str) -> int:
    consumers = {c["name"]: c["pending"] for c in r.xinfo_consumers(f"{prefix}:requests", f"{prefix}:workers")}
    return consumers.get(consumer, 0)


def test_a_stopping_worker_puts_its_unstarted_entries_back(redis_server, engine):
    r = redis_server.client()
    requests = [dict(context=context(i, 2), query=QUERY, budget=20 + i) for i in range(6)]
    wanted = [expected(engine, **q) for q in requests]
    with ServiceThread(redis_config(redis_server, "graceful")) as svc:
        async def main():
            async with AsyncClient(f"127.0.0.1:{svc.grpc_port}", timeout=300) as c:
                return await asyncio.gather(*(c.compress(q["context"], q["query"], budget=q["budget"]) for q in requests))

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            calls = pool.submit(asyncio.run, main())
            wait_for(lambda: r.xlen("graceful:requests") == 6, 60, "six queued entries")
            config = redis_config(redis_server, "graceful", max_wait_ms=500.0)
            with WorkerThread(engine, config, name="leaving"):
                wait_for(lambda: _owned(r, "graceful", "leaving") == 6, 60, "the worker to take all six")
            # stopped: at most the request it had started was finished; the rest are back, unowned
            assert _owned(r, "graceful", "leaving") == 0
            assert r.xlen("graceful:requests") in (5, 6)
            assert r.xpending("graceful:requests", "graceful:workers")["pending"] == 0
            with WorkerThread(engine, config, name="staying"):
                results = calls.result()
    assert [comparable(result) for result in results] == wanted
    assert r.xlen("graceful:requests") == 0


def test_worker_runs_in_the_dtype_it_is_given(redis_server):
    # --dtype reaches the worker's model: its model info says so and its answers are float32's
    worker = WorkerProcess(redis_server.url, "f32", "w-f32", "--dtype", "float32")
    try:
        worker.wait_registered(redis_server.client())
        with ServiceThread(redis_config(redis_server, "f32")) as svc:
            with Client(f"127.0.0.1:{svc.grpc_port}", timeout=120) as client:
                info = client.model_info()
                assert (info.device, info.dtype) == ("cpu", "float32")
                result = client.compress(context(2), QUERY, budget=40)
        float32 = Engine(EngineConfig(dtype="float32"))
        assert comparable(result) == comparable(float32.compress(CompressRequest(context=context(2), query=QUERY, budget=40)))
    finally:
        worker.stop()


def test_finish_tells_its_own_earlier_delivery_from_another_workers(redis_server):
    """FINISH against a real redis-server: a delivery's retry after its reply was lost is told apart (2) from a
    late delivery of another worker (0); the result is pushed once."""
    from ilre.service.queue.scripts import FINISH

    r = redis_server.client()
    stream, group, rid = "fx:requests", "fx:workers", "rid-1"
    r.xgroup_create(stream, group, id="0", mkstream=True)
    entry = r.xadd(stream, {"rid": rid})
    r.xreadgroup(group, "w1", {stream: ">"}, count=1)
    finish = r.register_script(FINISH)
    keys = [stream, f"fx:result:{rid}", "fx:unfinished:k", f"fx:done:{rid}"]
    args = lambda worker, token: [group, entry, worker, '{"ok": 1}', 30, rid, token]  # noqa: E731
    assert finish(keys=keys, args=args("w1", "w1:a")) == 1
    assert finish(keys=keys, args=args("w1", "w1:a")) == 2  # the same delivery asking again: its own
    assert finish(keys=keys, args=args("w2", "w2:b")) == 0  # another worker's late result: dropped
    assert r.llen(f"fx:result:{rid}") == 1 and r.xlen(stream) == 0


def test_taking_back_its_own_entries_counts_no_delivery(redis_server):
    """OWN against a real redis-server: a worker taking its own pending entry back, five times (a flaky link), gets
    its fields each time and leaves its delivery count at 1 (XREADGROUP from id 0 would make it 6: dead-lettered as
    if five workers had died on it); an entry deleted meanwhile is acknowledged, not returned."""
    from ilre.service.queue.scripts import OWN

    r = redis_server.client()
    stream, group = "own:requests", "own:workers"
    r.xgroup_create(stream, group, id="0", mkstream=True)
    kept, gone = r.xadd(stream, {"rid": "a", "payload": "p"}), r.xadd(stream, {"rid": "b"})
    r.xreadgroup(group, "w1", {stream: ">"}, count=2)
    r.xdel(stream, gone)
    own = r.register_script(OWN)
    for _ in range(5):
        [(entry, flat)] = own(keys=[stream], args=[group, "w1", 10])
        assert entry == kept and flat == ["rid", "a", "payload", "p"]
    [pending] = r.xpending_range(stream, group, "-", "+", 10)
    assert pending["message_id"] == kept and pending["times_delivered"] == 1
    assert own(keys=[stream], args=[group, "w2", 10]) == []  # another consumer's entries are not its own


def test_a_dead_letter_never_follows_an_answer(redis_server):
    """DEAD_LETTER against a real redis-server: an entry already answered (its done marker set, e.g. by a delivery
    whose acknowledgement a failover lost) is only acknowledged: its caller never gets a second, error result; one
    not answered goes to the dead letters with an error result."""
    from ilre.service.queue.scripts import DEAD_LETTER

    r = redis_server.client()
    stream, group = "dlx:requests", "dlx:workers"
    r.xgroup_create(stream, group, id="0", mkstream=True)
    answered, abandoned = r.xadd(stream, {"rid": "a"}), r.xadd(stream, {"rid": "b"})
    r.xreadgroup(group, "w1", {stream: ">"}, count=2)
    r.set("dlx:done:a", "w1:token")
    r.lpush("dlx:result:a", '{"ok": 1}')
    dead = r.register_script(DEAD_LETTER)
    keys = lambda rid: [stream, f"dlx:result:{rid}", "dlx:unfinished:k", f"dlx:done:{rid}", "dlx:dead-letter"]  # noqa: E731
    assert dead(keys=keys("a"), args=[group, answered, "a", '{"error": 1}', 30, "rid", "a"]) == 0
    assert r.lrange("dlx:result:a", 0, -1) == ['{"ok": 1}'] and r.xlen("dlx:dead-letter") == 0
    assert dead(keys=keys("b"), args=[group, abandoned, "b", '{"error": 1}', 30, "rid", "b", "attempts", "4"]) == 1
    assert r.lrange("dlx:result:b", 0, -1) == ['{"error": 1}'] and r.get("dlx:done:b") == "dead-letter"
    [(_, fields)] = r.xrange("dlx:dead-letter")
    assert fields == {"rid": "b", "attempts": "4"}
    assert r.xlen(stream) == 0 and r.xpending(stream, group)["pending"] == 0


def test_a_worker_whose_read_reply_is_lost_takes_its_entry_back_at_once(redis_server, engine):
    """Redis hands the worker an entry and the reply never arrives (the connection drops after XREADGROUP ran):
    the worker reads its own pending entries right after, so the caller is answered well within claim_idle, by
    this worker, with no reclaim."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    query = dict(context=context(3, 2), query=QUERY, budget=24)
    config = redis_config(redis_server, "lost", claim_idle_ms=120000.0)
    with ServiceThread(config) as svc, WorkerThread(engine, config, name="unlucky") as thread:
        client, lost = thread.worker.client, []
        read = client.xreadgroup

        async def loses_first_reply(*args, **kwargs):
            reply = await read(*args, **kwargs)
            if reply and not lost and ">" in args[2].values():
                lost.append(reply)
                raise RedisConnectionError("the reply was lost on the way")
            return reply

        client.xreadgroup = loses_first_reply
        start = time.monotonic()
        with Client(f"127.0.0.1:{svc.grpc_port}", timeout=60) as c:
            result = c.compress(query["context"], query["query"], budget=query["budget"])
        took = time.monotonic() - start
        assert lost and comparable(result) == expected(engine, **query)
        assert took < 30  # claim_idle is 120 s: not a reclaim
        assert thread.worker.metrics.own_pending_taken._value.get() == 1
        assert thread.worker.metrics.reclaimed._value.get() == 0
