"""The Redis queue across hosts under network faults: three Redis hosts with a sentinel each, two worker hosts, a
front end host and a client host, in network namespaces (tests/hosts/site.py). Faults by link: a worker cut from
Redis mid-request, a front end cut from Redis, the master cut from its replicas and sentinels (a failover, then it
rejoins as a replica; with the front end on either side, followed within 3 s of the heal), 200 ms of delay and 5% loss
on the workers' links, a worker host frozen past claim_idle. In each:
every accepted request gets one answer, equal to its answer on the idle service, or a clear error within its
deadline; none is lost or answered twice (no entry left on the stream, no result left unread); the metrics count
the retries, reclaims and stale results dropped."""

from __future__ import annotations

import time

import pytest

from .cluster import missing_tools
from .services import wait_until
from .site import CLAIM_IDLE_MS, FROZEN_S, PREFIX, REDIS, RETRY_S, WORKERS, started_site

TAKEOVER_S = 1.5 * CLAIM_IDLE_MS / 1000 + 8
# the front end and workers ask every sentinel each second and go by the majority (the shared document tier's client
# moved with the queue's): 2 s, plus the test's own polling of the old master under load
FOLLOWED_S = 3.0

pytestmark = pytest.mark.skipif(missing_tools() is not None, reason=str(missing_tools()))


@pytest.fixture(scope="module")
def site():
    with started_site(6) as site:
        yield site


def test_a_worker_cut_from_redis_mid_request_answers_after_the_heal(site):
    finish_retries = lambda w: site.metric(w, "ilre_redis_retries_total", 'call="finish"')
    before = {w: finish_retries(w) for w in WORKERS}
    [future] = site.send(0)
    owner = site.wait_owner()
    site.cluster.cut(owner, *REDIS)
    cut_at = time.monotonic()
    computed = lambda: sum("worker OK" in line for line in site.workers[owner].lines)
    done_before = computed()
    wait_until(lambda: computed() > done_before, 60, f"{owner} to compute the request")
    wait_until(lambda: finish_retries(owner) > before[owner], 10,
               f"{owner}'s write of the result to run into the cut (each Redis call is bounded to 3 s)")
    site.cluster.heal(owner, *REDIS)
    cut_for = time.monotonic() - cut_at
    # idle from its delivery, just before the cut, to its write after the heal (backoff up to 1 s): under claim_idle,
    # so nobody takes it over
    assert cut_for < CLAIM_IDLE_MS / 1000 - 1.5
    response, seconds = future.result(90)
    site.same_as_idle(0, response)
    site.settled()
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
    batches = {w: site.metric(w, "ilre_batch_size_count") for w in WORKERS}
    [future] = site.send(3)
    owner = site.wait_owner()
    # frozen once it holds the request (its batch started): frozen between Redis handing it the entry and its
    # reading the reply, it never holds it (its client reads again after the thaw) and has no late result
    wait_until(lambda: site.metric(owner, "ilre_batch_size_count") > batches[owner], 30,
               f"{owner} to start the request", interval=0.02)
    other = next(w for w in WORKERS if w != owner)
    reclaimed, dropped = site.metric(other, "ilre_reclaimed_total"), site.metric(owner, "ilre_stale_results_dropped_total")
    site.cluster.freeze(owner)
    frozen_at = time.monotonic()
    try:  # the other worker looks every claim_idle/2 for entries idle past claim_idle: up to 1.5 claim_idle after
        # the owner's last refresh of its claim, and a loaded machine's seconds on top
        wait_until(lambda: site.metric(other, "ilre_reclaimed_total") == reclaimed + 1, TAKEOVER_S,
                   f"the other worker to take the request over (claim_idle {CLAIM_IDLE_MS / 1000:g} s)")
        time.sleep(max(0.0, FROZEN_S - (time.monotonic() - frozen_at)))
    finally:  # thawed whatever happened, so that the next test finds both workers running
        frozen_for = time.monotonic() - frozen_at
        site.cluster.thaw(owner)
    response, answered = future.result(90)  # seconds from sending it
    site.same_as_idle(3, response)
    try:
        wait_until(lambda: site.metric(owner, "ilre_stale_results_dropped_total") == dropped + 1, 60,
                   "the frozen worker to drop its late result")
    except TimeoutError as exc:  # what the frozen worker did after the thaw, for whoever reads the failure
        retries = {call: site.metric(owner, "ilre_redis_retries_total", f'call="{call}"') for call in ("finish", "cancel")}
        raise TimeoutError(f"{exc}; its Redis retries {retries}; its last log lines:\n"
                           + "\n".join(site.workers[owner].lines[-15:])) from None
    site.settled()  # its late result was not delivered: no second result anywhere
    print(f"worker frozen {frozen_for:.1f} s: answered by the other in {answered:.1f} s; the late result dropped")


def test_the_master_cut_from_its_replicas_and_sentinels_fails_over_and_rejoins(site):
    followed, during = split_master(site)
    print(f"failover: the request sent during it: {during}; front end and workers on the new master "
          f"{followed:.1f} s after the heal; requests run again after a lost acknowledgement: {site.reruns}")


def test_a_front_end_on_the_old_masters_side_follows_within_two_seconds_of_the_heal(site):
    """The front end cut with the old master from the rest: it sees only the old master's sentinel until the heal,
    then follows the majority's answer."""
    followed, during = split_master(site, with_old=("fe",))
    print(f"failover, the front end on the old master's side: the request sent during it: {during}; front end and "
          f"workers on the new master {followed:.1f} s after the heal")


def split_master(site, with_old: tuple[str, ...] = ()) -> tuple[float, int]:
    """Cut the master (and the hosts `with_old`) from its replicas and sentinels until a replica is promoted, send a
    request, heal; checks every answer and that the front end and workers follow the new master (their clients
    moved, none left on the old master) within FOLLOWED_S of the heal. (seconds after the heal, the status of the
    request sent during the split)"""
    old = site.group.master()
    rest = [h for h in REDIS if h != old]
    lines = {h: len(process(site, h).lines) for h in ("fe", *WORKERS)}
    [in_flight] = site.send(4, timeout_s=120)
    site.wait_owner()
    for host in (old, *with_old):
        site.cluster.cut(host, *rest)
    wait_until(lambda: site.group.sentinel_call(rest[0], "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "ilre")[0]
               != site.cluster.address(old), 60, "the sentinels to promote a replica")
    during = site.compress(5, timeout_s=60)  # answered by the new master's side, or refused clearly, never lost
    assert during.status_code in (200, 503), during.text
    if during.status_code == 503:
        assert "retry" in during.json()["error"]
    for host in (old, *with_old):
        site.cluster.heal(host, *rest)
    healed_at = time.monotonic()
    new = next(h for h in rest if site.cluster.address(h) == site.group.sentinel_call(
        rest[0], "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "ilre")[0])
    moved_to = f"to {site.cluster.address(new)}:"

    def followed_new_master(host: str) -> bool:  # its clients moved, and none still connected to the old master
        clients = site.group.nodes[old].call("client", lambda r: r.client_list())
        return (any("Redis master moved" in line and moved_to in line for line in process(site, host).lines[lines[host]:])
                and not any(c["addr"].rsplit(":", 1)[0] == site.cluster.address(host) for c in clients))

    wait_until(lambda: all(followed_new_master(h) for h in ("fe", *WORKERS)), 30, "the front end and workers to follow")
    followed = max(0.0, time.monotonic() - healed_at)
    assert followed < FOLLOWED_S, f"followed the new master {followed:.1f} s after the heal"
    wait_until(lambda: site.group.nodes[old].call("client", lambda r: r.info("replication")["role"]) == "slave", 60,
               "the old master to rejoin as a replica")
    response, _ = in_flight.result(120)
    site.same_as_idle(4, response)
    if during.status_code == 200:
        site.same_as_idle(5, during)
    site.same_as_idle(5, site.compress(5))
    site.settled(answered=(4, 5))
    return followed, during.status_code


def process(site, host: str):
    """The ilre process on `host` (the front end or a worker)."""
    return site.front if host == "fe" else site.workers[host]
