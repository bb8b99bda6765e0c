"""The Redis queue across hosts under network faults: three Redis hosts with a sentinel each, two worker hosts, a
front end host and a client host, in network namespaces (tests/hosts/cluster.py). Faults by link: a worker cut
from Redis mid-request, a front end cut from Redis, the master cut from its replicas and sentinels (a failover,
then it rejoins as a replica), 200 ms of delay and 5% loss on the workers' links, a worker host frozen 20 s. In
each: every accepted request gets one answer, equal to its answer on the idle service, or a clear error within
its deadline; none is lost or answered twice (no entry left on the stream, no result left unread); the metrics
count the retries, reclaims and stale results dropped."""

from __future__ import annotations

import concurrent.futures
import json
import re
import time

import httpx
import pytest

from ilre.evaluation.tasks.haystack import pydoc_text

from .cluster import Cluster, missing_tools
from .services import HTTP_PORT, SentinelHosts, serve_on, wait_until, worker_on

pytestmark = pytest.mark.skipif(missing_tools() is not None, reason=str(missing_tools()))

PREFIX, REDIS, WORKERS = "np", ["r1", "r2", "r3"], ["w1", "w2"]
CLAIM_IDLE_MS, RETRY_S, METRICS_PORT = 12000, 4, 9100
QUERY = "What is the harbour code of record {i}?"


def request(i: int) -> dict:
    """~2,500 tokens of pydoc text with fact i planted in its middle (a few seconds on one thread)."""
    text = pydoc_text()
    start = 9000 * i % (len(text) - 12000)
    body = text[start:start + 10000]
    return {"context": f"{body[:5000]}\nThe harbour code of record {i} is {7100 + i}.\n{body[5000:]}",
            "query": QUERY.format(i=i), "budget": 128}


@pytest.fixture(scope="module")
def site():
    with Cluster([*REDIS, *WORKERS, "fe", "client"]) as cluster:
        for worker in WORKERS:
            cluster.shape(worker, *REDIS)  # their links can be slowed later
        group = SentinelHosts(cluster, REDIS, 2000, "--min-replicas-to-write", "1", "--min-replicas-max-lag", "5")
        workers = {w: worker_on(cluster, w, group, PREFIX, "--claim-idle-ms", str(CLAIM_IDLE_MS), "--max-batch", "1",
                                "--metrics-port", str(METRICS_PORT), "--host", "0.0.0.0") for w in WORKERS}
        front = serve_on(cluster, "fe", group.url, PREFIX, "--redis-retry", str(RETRY_S))
        site = Site(cluster, group, workers, front)
        site.reference = {i: site.compress(i) for i in range(6)}  # the answers on the idle service
        assert all(r.status_code == 200 for r in site.reference.values())
        yield site


class Site:
    def __init__(self, cluster: Cluster, group: SentinelHosts, workers: dict, front):
        self.cluster, self.group, self.workers, self.front = cluster, group, workers, front
        self.reference: dict[int, httpx.Response] = {}
        self.http = cluster.on("client", lambda: httpx.Client(timeout=120))

    def compress(self, i: int, timeout_s: float = 90) -> httpx.Response:
        """POST /v1/compress from the client host, the request's deadline `timeout_s`."""
        url = f"http://{self.cluster.address('fe')}:{HTTP_PORT}/v1/compress"
        return self.cluster.on("client", lambda: self.http.post(url, json=request(i), headers={
            "x-request-timeout": str(timeout_s)}))

    def send(self, *numbers: int, timeout_s: float = 90) -> list[concurrent.futures.Future]:
        """Requests sent at once from the client host; futures of (response, seconds)."""
        def timed(i: int):
            start = time.monotonic()
            return self.compress(i, timeout_s), time.monotonic() - start
        return [self.cluster.pool("client").submit(timed, i) for i in numbers]

    def same_as_idle(self, i: int, response: httpx.Response) -> None:
        assert response.status_code == 200, response.text
        strip = lambda r: {k: v for k, v in r.json().items() if k not in ("timings_ms", "id", "document_id")}
        assert strip(response) == strip(self.reference[i])
        assert f"is {7100 + i}" in response.json()["compressed_context"]

    def redis(self, fn):
        """fn(client of the current master), from the client host."""
        return self.group.nodes[self.group.master()].call("client", fn)

    def pending_owner(self) -> str | None:
        """The worker holding the one pending entry, once there is one."""
        rows = self.redis(lambda r: r.xpending_range(f"{PREFIX}:requests", f"{PREFIX}:workers", "-", "+", 10))
        return rows[0]["consumer"] if rows else None

    def wait_owner(self) -> str:
        owner: list[str] = []
        wait_until(lambda: (o := self.pending_owner()) and not owner.append(o), 60, "a worker to take the request")
        return owner[0]

    def settled(self, answered: tuple[int, ...] = ()) -> None:
        """Nothing lost or answered twice: no entry on the stream or pending, no result left unread (but, with
        `answered`, a second result of one of those requests: run again on the new master after its worker's
        acknowledgement was lost with the old one's writes; its caller had its one answer)."""
        wait_until(lambda: self.redis(lambda r: r.xlen(f"{PREFIX}:requests")) == 0, 60, "the stream to empty")
        left = self.redis(lambda r: [r.lrange(k, 0, -1) for k in r.keys(f"{PREFIX}:result:*")])
        again = {self.reference[i].json()["compressed_context"] for i in answered}
        for results in left:
            assert len(results) == 1 and answered, f"results left unread: {results}"
            ok = json.loads(results[0])["ok"]
            assert (ok.get("compressed_context") or ok["results"][0]["compressed_context"]) in again
        self.redis(lambda r: [r.delete(k) for k in r.keys(f"{PREFIX}:result:*")])
        self.reruns = len(left)

    def metric(self, host: str, name: str) -> float:
        """A counter's total (all its labels) as the host's /metrics says it."""
        port = HTTP_PORT if host == "fe" else METRICS_PORT
        text = self.cluster.on("client", lambda: httpx.get(f"http://{self.cluster.address(host)}:{port}/metrics",
                                                           timeout=10).text)
        return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def test_a_worker_cut_from_redis_mid_request_answers_after_the_heal(site):
    before = {w: site.metric(w, "ilre_redis_retries_total") for w in WORKERS}
    [future] = site.send(0)
    owner = site.wait_owner()
    site.cluster.cut(owner, *REDIS)
    cut_at = time.monotonic()
    computed = lambda: sum("worker OK" in line for line in site.workers[owner].lines)
    done_before = computed()
    wait_until(lambda: computed() > done_before, 60, f"{owner} to compute the request")
    time.sleep(3.5)  # its write of the result runs into the cut (each Redis call is bounded to 3 s)
    site.cluster.heal(owner, *REDIS)
    cut_for = time.monotonic() - cut_at
    assert cut_for < CLAIM_IDLE_MS / 1000 * 2 / 3  # shorter than claim_idle less a renewal: nobody takes it over
    response, seconds = future.result(90)
    site.same_as_idle(0, response)
    site.settled()
    assert site.metric(owner, "ilre_redis_retries_total") > before[owner]  # its write of the result, retried
    assert sum(site.metric(w, "ilre_reclaimed_total") for w in WORKERS) == 0
    print(f"worker cut {cut_for:.1f} s mid-request: answered 200 in {seconds:.1f} s")


def test_a_front_end_cut_from_redis_tells_its_caller_within_the_retry_setting(site):
    [future] = site.send(1, timeout_s=120)
    site.wait_owner()
    site.cluster.cut("fe", *REDIS)
    cut_at = time.monotonic()
    response, _ = future.result(120)
    heard = time.monotonic() - cut_at
    site.cluster.heal("fe", *REDIS)
    assert response.status_code == 503, response.text
    assert "Redis is unreachable" in response.json()["error"]
    assert heard <= RETRY_S + 5, f"the caller heard after {heard:.1f} s"
    print(f"front end cut: 503 {heard:.1f} s after the cut (--redis-retry {RETRY_S})")
    assert site.metric("fe", "ilre_redis_retries_total") > 0
    wait_until(lambda: site.redis(lambda r: r.xlen(f"{PREFIX}:requests")) == 0, 60, "the abandoned request to finish")
    site.redis(lambda r: r.delete(*r.keys(f"{PREFIX}:result:*")) if r.keys(f"{PREFIX}:result:*") else 0)
    site.same_as_idle(2, site.compress(2))  # healed: served again
    site.settled()


def test_delay_and_loss_on_the_workers_links(site):
    for worker in WORKERS:
        for node in REDIS:
            site.cluster.delay(worker, node, 200)
            site.cluster.loss(worker, node, 5)
    try:
        futures = site.send(0, 1, 2, 3)
        for i, future in enumerate(futures):
            response, seconds = future.result(120)
            site.same_as_idle(i, response)
            print(f"200 ms delay and 5% loss: request {i} answered in {seconds:.1f} s")
    finally:
        for worker in WORKERS:
            site.cluster.heal(worker, *REDIS)
    site.settled()


def test_a_frozen_worker_host_is_taken_over_and_its_late_result_dropped(site):
    [future] = site.send(3)
    owner = site.wait_owner()
    other = next(w for w in WORKERS if w != owner)
    reclaimed = site.metric(other, "ilre_reclaimed_total")
    site.cluster.freeze(owner)
    frozen_at = time.monotonic()
    wait_until(lambda: site.metric(other, "ilre_reclaimed_total") == reclaimed + 1, 20,
               "the other worker to take the request over (claim_idle 12 s)")
    time.sleep(max(0.0, 20 - (time.monotonic() - frozen_at)))
    site.cluster.thaw(owner)
    response, answered = future.result(90)  # seconds from sending it
    site.same_as_idle(3, response)
    wait_until(lambda: site.metric(owner, "ilre_stale_results_dropped_total") == 1, 60,
               "the frozen worker to drop its late result")
    site.settled()  # its late result was not delivered: no second result anywhere
    print(f"worker frozen 20 s: answered by the other in {answered:.1f} s; the late result dropped")


def test_the_master_cut_from_its_replicas_and_sentinels_fails_over_and_rejoins(site):
    old = site.group.master()
    rest = [h for h in REDIS if h != old]
    [in_flight] = site.send(4, timeout_s=120)
    site.wait_owner()
    site.cluster.cut(old, *rest)
    wait_until(lambda: site.group.sentinel_call(rest[0], "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "ilre")[0]
               != site.cluster.address(old), 60, "the sentinels to promote a replica")
    during = site.compress(5, timeout_s=60)  # answered by the new master's side, or refused clearly, never lost
    assert during.status_code in (200, 503), during.text
    if during.status_code == 503:
        assert "retry" in during.json()["error"]
    site.cluster.heal(old, *rest)
    wait_until(lambda: site.group.nodes[old].call("client", lambda r: r.info("replication")["role"]) == "slave", 60,
               "the old master to rejoin as a replica")
    response, _ = in_flight.result(120)
    site.same_as_idle(4, response)
    if during.status_code == 200:
        site.same_as_idle(5, during)
    site.same_as_idle(5, site.compress(5))
    site.settled(answered=(4, 5))
    print(f"failover: the request sent during it: {during.status_code}; requests run again after a lost "
          f"acknowledgement: {site.reruns}")
