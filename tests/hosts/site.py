"""The queue on seven hosts for the partition tests and soak (test support): three Redis hosts with a sentinel each
(min-replicas-to-write 1), two worker hosts whose links to Redis can be slowed, a front end and a client; requests
from the client host, answers checked against the idle service's, Redis and /metrics read from the client host."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import re
import time
from typing import Iterator

import httpx

from ilre.evaluation.tasks.haystack import pydoc_text

from .cluster import Cluster
from .services import HTTP_PORT, SentinelHosts, serve_on, wait_until, worker_on

PREFIX, REDIS, WORKERS = "np", ["r1", "r2", "r3"], ["w1", "w2"]
CLAIM_IDLE_MS, RETRY_S, METRICS_PORT = 20000, 4, 9100  # claim_idle: a request computed with the CPU shared
FROZEN_S = CLAIM_IDLE_MS / 1000 + 8  # a frozen worker host stays stopped past claim_idle: its entry is taken over
QUERY = "What is the harbour code of record {i}?"


def request(i: int) -> dict:
    """~2,500 tokens of pydoc text with fact i planted in its middle (a few seconds on one thread)."""
    text = pydoc_text()
    start = 9000 * i % (len(text) - 12000)
    body = text[start:start + 10000]
    return {"context": f"{body[:5000]}\nThe harbour code of record {i} is {7100 + i}.\n{body[5000:]}",
            "query": QUERY.format(i=i), "budget": 128}


@contextlib.contextmanager
def started_site(requests: int, *worker_args: str) -> Iterator["Site"]:
    """The seven hosts running, `requests` reference answers taken on the idle service; removed after."""
    with Cluster([*REDIS, *WORKERS, "fe", "client"]) as cluster:
        for worker in WORKERS:
            cluster.shape(worker, *REDIS)  # their links can be slowed later
        group = SentinelHosts(cluster, REDIS, 2000, "--min-replicas-to-write", "1", "--min-replicas-max-lag", "5")
        workers = {w: worker_on(cluster, w, group, PREFIX, "--claim-idle-ms", str(CLAIM_IDLE_MS), "--max-batch", "1",
                                "--metrics-port", str(METRICS_PORT), "--host", "0.0.0.0", *worker_args)
                   for w in WORKERS}
        front = serve_on(cluster, "fe", group.url, PREFIX, "--redis-retry", str(RETRY_S))
        site = Site(cluster, group, workers, front)
        site.reference = {i: site.compress(i) for i in range(requests)}  # the answers on the idle service
        failed = {i: r.text for i, r in site.reference.items() if r.status_code != 200}
        if failed:
            raise RuntimeError(f"the idle service failed requests: {failed}")
        yield site


class Site:
    def __init__(self, cluster: Cluster, group: SentinelHosts, workers: dict, front):
        self.cluster, self.group, self.workers, self.front = cluster, group, workers, front
        self.reference: dict[int, httpx.Response] = {}
        self.http = cluster.on("client", lambda: httpx.Client(timeout=120))

    def compress(self, i: int, timeout_s: float = 90, request_id: str | None = None) -> httpx.Response:
        """POST /v1/compress from the client host, the request's deadline `timeout_s`; `request_id`: the body's
        `id`, which its result carries (also one left unread on Redis)."""
        url = f"http://{self.cluster.address('fe')}:{HTTP_PORT}/v1/compress"
        body = request(i) if request_id is None else {**request(i), "id": request_id}
        return self.cluster.on("client", lambda: self.http.post(url, json=body, headers={
            "x-request-timeout": str(timeout_s)}))

    def send(self, *numbers: int, timeout_s: float = 90) -> list[concurrent.futures.Future]:
        """Requests sent at once from the client host; futures of (response, seconds)."""
        def timed(i: int):
            start = time.monotonic()
            return self.compress(i, timeout_s), time.monotonic() - start
        return [self.cluster.pool("client").submit(timed, i) for i in numbers]

    def same_as_idle(self, i: int, response: httpx.Response) -> None:
        assert response.status_code == 200, response.text
        strip = lambda r: {k: v for k, v in r.json().items()
                           if k not in ("timings_ms", "id", "document_id", "resumed_tokens")}
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
            ok = json.loads(results[0]).get("ok")
            assert ok, f"an error result left unread: {results[0]}"
            assert (ok.get("compressed_context") or ok["results"][0]["compressed_context"]) in again
        self.redis(lambda r: [r.delete(k) for k in r.keys(f"{PREFIX}:result:*")])
        self.reruns = len(left)

    def metric(self, host: str, name: str, label: str = "") -> float:
        """A counter's total (all its labels, or those of series with `label`, e.g. 'call="finish"') as the host's
        /metrics says it."""
        port = HTTP_PORT if host == "fe" else METRICS_PORT
        text = self.cluster.on("client", lambda: httpx.get(f"http://{self.cluster.address(host)}:{port}/metrics",
                                                           timeout=10).text)
        series = re.findall(rf"^{name}(?:{{([^}}]*)}})? (\S+)$", text, re.M)
        return sum(float(v) for labels, v in series if label in labels)
