"""Redis high availability with Sentinel, all real processes on loopback: a master, two replicas,
three sentinels, two `ilre worker` processes and a front end, all given the redis+sentinel:// URL.
The master is killed with SIGKILL under load; every request is answered exactly once with the
correct result, and the only errors callers ever see are UNAVAILABLE for requests the queue had
not accepted (retried by the caller)."""

from __future__ import annotations

import concurrent.futures
import signal
import threading
import time

import httpx
import pytest
import torch

from ilre.service.client import Client, ClientError
from ilre.service.common.errors import ConfigError
from ilre.service.common.redis_connection import CALL_S, sync_client
from ilre.service.common.redis_url import parse_redis_url
from ilre.service.documents.redis_tier import OUTAGE_S, RedisDocuments
from ilre.service.server import ServiceThread

from .conftest import QUERY, RedisServer, WorkerProcess, comparable, context, free_port, service_config, wait_for
from .redis_group import DOWN_AFTER_MS, SentinelGroup
from .test_redis_queue import expected

PREFIX = "ha"


def test_sentinel_urls_are_parsed_and_bad_ones_name_the_field():
    target = parse_redis_url("redis+sentinel://:s3cret@10.0.0.1:26379,[::1]:26380/cache/3?sentinel_password=x")
    assert target.sentinels == (("10.0.0.1", 26379), ("::1", 26380)) and target.master == "cache" and target.db == 3
    assert target.password == "s3cret" and target.sentinel_password == "x"
    assert "s3cret" not in target.redacted() and "s3cret" not in repr(target)
    assert not parse_redis_url("redis://127.0.0.1:6379/0").sentinel
    for bad, says in [("redis+sentinel://127.0.0.1/ilre", "is not host:port"),
                      ("redis+sentinel://127.0.0.1:26379", "MASTER[/db]"),
                      ("redis+sentinel://127.0.0.1:26379/ilre/x", "MASTER[/db]"),
                      ("http://127.0.0.1:6379", "must start with")]:
        with pytest.raises(ConfigError) as err:
            service_config(redis_url=bad)
        assert str(err.value).startswith("redis_url: ") and says in str(err.value)
    assert service_config(redis_url="redis+sentinel://h:1/m").wait_replicas == 1
    assert service_config(redis_url="redis://h:1/0").wait_replicas == 0


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    group = SentinelGroup(tmp_path_factory.mktemp("sentinel"))
    yield group
    group.stop()


def test_kill_the_master_under_load_every_request_answered_once(group, engine):
    master = sync_client(group.url, decode_responses=True, socket_timeout=5)
    extra = ("--claim-idle-ms", "3000", "--max-batch", "4", "--max-wait-ms", "20")
    workers = [WorkerProcess(group.url, PREFIX, f"ha-{i}", *extra) for i in range(2)]
    n_requests, answers, errors, spans = 48, {}, [], []
    lock, next_request = threading.Lock(), iter(range(n_requests))
    try:
        for worker in workers:
            worker.wait_registered(master)
        config = service_config(redis_url=group.url, redis_prefix=PREFIX, redis_retry_s=30.0)
        with ServiceThread(config) as svc:
            def client_loop() -> None:
                with Client(f"127.0.0.1:{svc.grpc_port}", timeout=120) as client:
                    for i in next_request:
                        while True:  # a request the queue did not accept is retried, as a caller would
                            sent = time.monotonic()
                            try:
                                result = client.compress(context(i, 2), QUERY, budget=24 + i % 8, id=f"r{i}")
                            except ClientError as exc:
                                with lock:
                                    errors.append((i, exc.code, exc.message))
                                if exc.code != "UNAVAILABLE":
                                    return
                                time.sleep(0.2)
                                continue
                            with lock:
                                assert f"r{i}" not in answers
                                answers[f"r{i}"] = result
                                spans.append((sent, time.monotonic()))
                            break

            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                loops = [pool.submit(client_loop) for _ in range(4)]
                wait_for(lambda: len(answers) >= 12, 300, "answers before the failover")
                old_port = group.master_port()
                killed_at, killed = time.monotonic(), group.kill_master()
                wait_for(lambda: group.master_port() not in (None, old_port), 60, "the sentinels to promote a replica")
                promoted_after = time.monotonic() - killed_at
                for done in loops:
                    done.result()
            ready = httpx.get(f"http://127.0.0.1:{svc.http_port}/readyz", timeout=10)
        # every request: exactly one answer, the one the engine gives alone
        assert sorted(answers) == sorted(f"r{i}" for i in range(n_requests))
        for i in range(n_requests):
            want = expected(engine, context=context(i, 2), query=QUERY, budget=24 + i % 8)
            assert comparable(answers[f"r{i}"]) == want, i
        # the only errors: enqueues refused while no master answered (not accepted), never a lost request
        assert all(code == "UNAVAILABLE" for _, code, _ in errors), errors
        assert not [e for e in errors if "accepted request waits" in e[2]], errors
        across = sum(sent < killed_at < done for sent, done in spans)
        assert across >= 1  # requests in flight when the master died were answered after the failover
        assert ready.status_code == 200
        new_master = group.node(group.master_port())
        assert new_master is not killed and new_master.client().info("replication")["role"] == "master"
        assert new_master.client().xlen(f"{PREFIX}:requests") == 0  # acknowledged and deleted on the new master
        assert {w.name for w in workers} <= {k.split(":")[-1] for k in new_master.client().scan_iter(f"{PREFIX}:worker:*")}
        print(f"\nfailover: promoted {promoted_after:.1f} s after SIGKILL; {across} requests in flight across it, "
              f"{len(errors)} enqueues refused and retried")
    finally:
        for worker in workers:
            worker.stop()
        master.close()


def test_a_request_no_replica_holds_is_not_accepted(redis_server):
    """redis_wait_replicas on a Redis without replicas: every enqueue is refused with a retryable
    UNAVAILABLE naming the setting, and the entry is cancelled so that no worker spends time on it."""
    r = redis_server.client()
    config = service_config(redis_url=redis_server.url, redis_prefix="nowait", redis_wait_replicas=1, redis_wait_ms=100)
    with ServiceThread(config) as svc, Client(f"127.0.0.1:{svc.grpc_port}", timeout=30) as client:
        with pytest.raises(ClientError) as err:
            client.compress(context(1), QUERY, budget=16)
        reply = httpx.post(f"http://127.0.0.1:{svc.http_port}/v1/compress", timeout=30,
                           json={"context": context(1), "query": QUERY, "budget": 16})
    assert err.value.code == "UNAVAILABLE" and "redis_wait_replicas" in err.value.message and "retry" in err.value.message
    assert reply.status_code == 503 and "not accepted" in reply.json()["error"]
    entries = r.xrange("nowait:requests")
    assert len(entries) == 2 and all(r.exists(f"nowait:cancel:{fields['rid']}") for _, fields in entries)


def test_a_documents_ids_outlive_a_failover(tmp_path):
    """A worker's IDs on the shared tier (what a document_id and a retrieve hash stand on): the write returns once
    a replica holds it, so killing the master right after loses nothing; a read sent before the sentinels have
    promoted a replica rides out the failover and finds them, where it used to answer "not there"."""
    group = SentinelGroup(tmp_path / "group")
    docs = RedisDocuments(group.url, "ids", wait_replicas=1, wait_ms=1000, retry_s=30.0)
    try:
        ids = torch.arange(5000)
        docs.put_ids("doc-1", ids, "owner")
        old_port = group.master_port()
        killed_at = time.monotonic()
        group.kill_master()
        found = docs.get_ids("doc-1")
        waited = time.monotonic() - killed_at
        assert found is not None and torch.equal(found, ids)
        assert group.master_port() not in (None, old_port)
        assert waited > DOWN_AFTER_MS / 1000  # the read was sent with no master and retried until one was promoted
        assert not docs.at_risk
    finally:
        docs.close()
        group.stop()


def test_ids_no_replica_holds_or_no_redis_takes_are_answered_and_counted(redis_server):
    """A write of IDs that no replica acknowledges in time is kept (the answer goes out) but counted unconfirmed;
    with Redis down for the whole of retry_s, writes and reads give up, counted, without raising."""
    docs = RedisDocuments(redis_server.url, "risk", wait_replicas=1, wait_ms=50)
    docs.put_ids("doc-1", torch.arange(10), "owner")
    assert docs.at_risk == {"unconfirmed": 1} and torch.equal(docs.get_ids("doc-1"), torch.arange(10))
    docs.close()
    gone = RedisDocuments(f"redis://127.0.0.1:{free_port()}/0", "risk", retry_s=0.5)
    started = time.monotonic()
    gone.put_ids("doc-1", torch.arange(10), "owner")
    assert gone.get_ids("doc-1") is None
    gone.put_state("doc-1", "key", {"x": torch.zeros(2)}, "owner")  # states are a cache: given up at once
    assert gone.at_risk == {"unstored": 1, "unread": 1} and 1.0 <= time.monotonic() - started < 3.0
    gone.close()


def test_a_silent_redis_costs_one_bounded_call_then_cache_calls_skip_it(tmp_path):
    """Redis frozen (SIGSTOP: connections stay open, nothing answers, as across a cut link): the first state read
    fails within one call's bound, the next reads and writes of states and prefixes do not wait for it (counted
    skipped), IDs still ride out retry_s; thawed, the cache is read again once the outage window has passed."""
    server = RedisServer(tmp_path)
    server.start()
    docs = RedisDocuments(server.url, "silent", retry_s=1.0)
    state = {"x": torch.arange(4.0)}
    try:
        docs.put_state("doc-1", "key", state, "owner")
        assert torch.equal(docs.get_state("doc-1", "key")["x"], state["x"])
        server.proc.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        assert docs.get_state("doc-1", "key") is None
        first = time.monotonic() - started
        assert CALL_S <= first < CALL_S + 1.5
        started = time.monotonic()
        docs.put_state("doc-2", "key", state, "owner")
        docs.put_prefix("slot", "doc-1")
        assert docs.get_prefixes(["slot"]) == [None] and docs.get_state("doc-1", "key") is None
        assert time.monotonic() - started < CALL_S / 3 and docs.skipped == 4  # none waited out a call's bound
        started = time.monotonic()
        docs.put_ids("doc-1", torch.arange(10), "owner")  # IDs are what a document_id stands on: not skipped
        assert docs.at_risk == {"unstored": 1} and 1.0 <= time.monotonic() - started < CALL_S * 2 + 1
        server.proc.send_signal(signal.SIGCONT)
        time.sleep(OUTAGE_S)
        assert torch.equal(docs.get_state("doc-1", "key")["x"], state["x"]) and docs.skipped == 4
    finally:
        server.proc.send_signal(signal.SIGCONT)
        docs.close()
        server.stop()
