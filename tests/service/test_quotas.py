"""Per-key fairness: the keys file's names and limits, the GCRA rate limit and the queue share in
process and in Redis (the same decisions), and refusals over real gRPC and HTTP: RESOURCE_EXHAUSTED
/ 429 with a retry-after that names the limit, other keys untouched, a rate shared by two front ends."""

from __future__ import annotations

import concurrent.futures
import math
import time

import httpx
import pytest

from ilre.service.client import Client, ClientError
from ilre.service.common.errors import ConfigError, ServiceError
from ilre.service.common.keys import ApiKeys, KeyPolicy
from ilre.service.queue.redis_stream import ADMIT
from ilre.service.common.quotas import KeyQuotas, gcra
from ilre.service.server import ServiceThread

from .conftest import QUERY, WorkerProcess, context, service_config
from .test_redis_queue import redis_config

LIMITED, FREE, SHARED = "k-limited-1b2c3d", "k-free-4e5f6a", "k-shared-7b8c9d"


def keys_file(tmp_path, text: str) -> str:
    path = tmp_path / "keys.txt"
    path.write_text(text)
    return str(path)


def test_the_keys_file_gives_names_and_limits_and_bad_lines_name_the_setting(tmp_path):
    keys = ApiKeys.load({"ILRE_API_KEYS": "k-env"}, keys_file(tmp_path, f"# team keys\n{LIMITED} name=team-a rate=2 "
                                                                         f"burst=3 queue_share=0.25  # a comment\n{FREE}\n"))
    team = keys.identify(f"Bearer {LIMITED}")
    assert team == KeyPolicy("team-a", 2.0, 3, 0.25) and team.queue_limit(32) == 8
    assert keys.identify(f"Bearer {FREE}").name.startswith("key-") and not keys.identify(f"Bearer {FREE}").limited
    assert keys.identify("Bearer k-env") is not None and keys.identify("Bearer nope") is None
    assert LIMITED not in repr(keys)
    assert ApiKeys.load({}, keys_file(tmp_path, f"{LIMITED} rate=1.5\n")).identify(f"Bearer {LIMITED}").burst == 2
    for line, says in [("k1 rate=0", "rate must be > 0"), ("k1 burst=2", "burst needs a rate"),
                       ("k1 rate=1 burst=0.5", "burst must be an integer >= 1"), ("k1 queue_share=1.5", "queue_share must be in (0, 1]"),
                       ("k1 speed=3", "expected name=, rate=, burst=, queue_share= or share="), ("k1 name=a\nk2 name=a", "more than one key")]:
        with pytest.raises(ConfigError) as err:
            ApiKeys.load({}, keys_file(tmp_path, line + "\n"))
        assert str(err.value).startswith("api_keys_file: ") and says in str(err.value), str(err.value)
    with pytest.raises(ConfigError) as err:
        ApiKeys.load({}, keys_file(tmp_path, "k1 rate=x\n"))
    assert "keys.txt:1" in str(err.value)


def test_gcra_admits_the_burst_then_the_rate():
    now = [100.0]
    quotas, policy = KeyQuotas(clock=lambda: now[0]), KeyPolicy("a", rate=2.0, burst=3)
    for _ in range(3):
        quotas.admit(policy, 100)
    with pytest.raises(ServiceError) as err:
        quotas.admit(policy, 100)
    assert err.value.code.value == "RESOURCE_EXHAUSTED" and err.value.retry_after_s == pytest.approx(0.5)
    assert "rate: key 'a' may send 2 requests/s, 3 at once" in err.value.message
    now[0] += 0.5
    quotas.admit(policy, 100)  # one interval later, one more
    with pytest.raises(ServiceError):
        quotas.admit(policy, 100)
    assert quotas.unfinished("a") == 4


def test_a_key_past_its_share_of_the_queue_waits_for_its_own_requests():
    quotas, policy = KeyQuotas(), KeyPolicy("b", queue_share=0.25)
    for _ in range(2):
        quotas.admit(policy, 8)
    with pytest.raises(ServiceError) as err:
        quotas.admit(policy, 8)
    assert "queue_share: key 'b' has 2 unfinished requests, its share of the queue is 2" in err.value.message
    quotas.admit(KeyPolicy("other", queue_share=0.25), 8)  # another key is not held back
    quotas.release(policy)
    quotas.admit(policy, 8)


def test_redis_admission_equals_the_in_process_rules(redis_server):
    """The same arrivals through the Lua script (a real Redis) and through KeyQuotas: same decisions and waits."""
    r = redis_server.client()
    admit = r.register_script(ADMIT)
    policy = KeyPolicy("eq", rate=4.0, burst=2, queue_share=0.5)
    arrivals = [0.0, 0.01, 0.02, 0.2, 0.26, 0.3, 0.51, 0.52, 0.9, 1.4, 1.41, 1.42, 2.5]
    finish_after = {0: 0.4, 1: 1.0, 3: 0.3}  # request i's slot is freed this long after it was accepted
    now = [0.0]
    local = KeyQuotas(clock=lambda: now[0])
    base, accepted_at, got_local, got_redis = 1_000_000.0, {}, [], []
    for i, t in enumerate(arrivals):
        now[0] = t
        for j, at in list(accepted_at.items()):  # free the slots of finished requests in both
            if j in finish_after and at + finish_after[j] <= t:
                local.release(policy)
                r.zrem("eq:unfinished:eq", f"r{j}")
                del accepted_at[j]
        try:
            local.admit(policy, 8)
            got_local.append(("ok", 0.0))
        except ServiceError as exc:
            got_local.append(("rate" if exc.message.startswith("rate") else "share", round(exc.retry_after_s or 0, 6)))
        status, _, wait = admit(keys=["eq:requests", "eq:unfinished:eq", "eq:rate:eq"],
                                args=[100, f"r{i}", "{}", base + t + 300, "eq", 4, 4.0, 2, repr(base + t), 30, f"q{i}", "", "key:eq"])
        got_redis.append({1: ("ok", 0.0), 2: ("share", 1.0), 3: ("rate", round(float(wait), 6))}[int(status)])
        if status == 1:
            accepted_at[i] = t
    got_local = [(kind, 1.0 if kind == "share" else wait) for kind, wait in got_local]
    assert got_redis == got_local
    assert {"ok", "rate", "share"} <= {kind for kind, _ in got_redis}
    assert all(fields["key"] == "eq" and fields["scope"] == "key:eq" for _, fields in r.xrange("eq:requests"))
    assert gcra(0.0, 10.0, 1.0, 1) == (True, 11.0, 0.0)


@pytest.fixture(scope="module")
def limited_service(engine, tmp_path_factory):
    path = keys_file(tmp_path_factory.mktemp("keys"), f"{LIMITED} name=team-a rate=0.2 burst=2\n{FREE} name=team-b\n")
    with ServiceThread(service_config(api_keys_file=path), engine) as svc:
        yield svc


def test_a_key_over_its_rate_gets_429_with_retry_after_and_others_go_on(limited_service):
    body = {"context": context(1), "query": QUERY, "budget": 16}
    url = f"http://127.0.0.1:{limited_service.http_port}/v1/compress"
    # rate 0.2/s, burst 2: the third request waits for the first one's token, 5 s after it was admitted,
    # so its retry hint is 5 s less the time since then, which this test measures instead of assuming
    with httpx.Client(timeout=120) as http:
        started = time.monotonic()
        replies = [http.post(url, json=body, headers={"authorization": f"Bearer {LIMITED}"}) for _ in range(3)]
        refused_by = time.monotonic() - started
        other = http.post(url, json=body, headers={"authorization": f"Bearer {FREE}"})
        metrics = http.get(f"http://127.0.0.1:{limited_service.http_port}/metrics").text
    assert [r.status_code for r in replies] == [200, 200, 429] and other.status_code == 200
    refused = replies[2].json()
    assert refused["code"] == "RESOURCE_EXHAUSTED" and "key 'team-a' may send 0.2 requests/s, 2 at once" in refused["error"]
    assert 5.0 - refused_by <= refused["retry_after_s"] <= 5.0
    assert replies[2].headers["retry-after"] == str(max(1, math.ceil(refused["retry_after_s"])))
    assert LIMITED not in refused["error"] and 'code="RESOURCE_EXHAUSTED"' in metrics
    with Client(f"127.0.0.1:{limited_service.grpc_port}", api_key=LIMITED) as client, pytest.raises(ClientError) as err:
        client.compress(context(1), QUERY, budget=16)
    refused_by = time.monotonic() - started
    assert err.value.code == "RESOURCE_EXHAUSTED" and 5.0 - refused_by <= err.value.retry_after_s <= 5.0
    assert "rate and burst in the keys file" in err.value.message


def test_through_redis_the_rate_is_shared_by_front_ends_and_the_share_is_freed_by_workers(redis_server, engine, tmp_path):
    path = keys_file(tmp_path, f"{SHARED} name=team-c rate=0.1 burst=3 queue_share=0.5\n")
    r = redis_server.client()
    worker = WorkerProcess(redis_server.url, "fair", "w-fair")
    try:
        worker.wait_registered(r)
        config = redis_config(redis_server, "fair", api_keys_file=path, max_queue=4)
        with ServiceThread(config) as a, ServiceThread(config) as b:
            def call(svc, i):
                with Client(f"127.0.0.1:{svc.grpc_port}", api_key=SHARED, timeout=120) as client:
                    try:
                        return client.compress(context(i), QUERY, budget=16).compressed_tokens
                    except ClientError as exc:
                        return exc
            assert call(a, 0) == 16 and call(b, 1) == 16  # 2 of the burst of 3, one on each front end
            assert r.zcard("fair:unfinished:team-c") == 0  # each worker answer freed its slot
            with concurrent.futures.ThreadPoolExecutor(3) as pool:  # 3 at once: the share (2 of 4) holds
                outcomes = list(pool.map(lambda i: call(a if i % 2 else b, i), range(2, 5)))
        refused = [o for o in outcomes if isinstance(o, ClientError)]
        assert sum(o == 16 for o in outcomes) == 1 and len(refused) == 2  # the burst's last token, then the rate
        assert all(o.code == "RESOURCE_EXHAUSTED" and o.retry_after_s > 0 for o in refused)
        assert any("team-c" in o.message for o in refused)
    finally:
        worker.stop()
