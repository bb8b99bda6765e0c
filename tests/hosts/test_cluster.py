"""The multi-host harness itself: hosts reach each other only, each fault does what it says on a real
redis-server across the switch, and nothing it made outlives it."""

from __future__ import annotations

import socket
import subprocess
import time

import pytest
import redis

from .cluster import Cluster, missing_tools, sweep_stale
from .services import RedisHost

pytestmark = pytest.mark.skipif(missing_tools() is not None, reason=str(missing_tools()))


def namespaces() -> list[str]:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()


def ping(host: RedisHost, viewer: str, timeout: float = 1.0) -> bool:
    try:
        return bool(host.call(viewer, lambda r: r.ping(), timeout=timeout))
    except redis.RedisError:
        return False


def round_trip_ms(cluster: Cluster, viewer: str, address: str) -> float:
    """The fastest of three PINGs from `viewer` (one alone may wait for a busy core: the delay is the point)."""
    def run() -> float:
        with redis.Redis(host=address, port=6379, socket_timeout=5) as client:
            client.ping()
            times = []
            for _ in range(3):
                start = time.monotonic()
                client.ping()
                times.append((time.monotonic() - start) * 1000)
            return min(times)
    return cluster.on(viewer, run)


def test_faults_by_link_and_host():
    with Cluster(["redis", "a", "b"]) as cluster:
        node = RedisHost(cluster, "redis")
        assert ping(node, "a") and ping(node, "b")
        assert cluster.address("a") != cluster.address("b") != node.address

        cluster.cut("a", "redis")
        start = time.monotonic()
        assert not ping(node, "a")  # silence, not a refusal: the call runs into its own timeout
        assert time.monotonic() - start >= 0.9
        assert ping(node, "b")  # the other link is untouched
        cluster.heal("a")
        assert ping(node, "a")

        cluster.shape("a", "redis")
        route = node.address  # a's connections to it are redirected through the proxy
        assert round_trip_ms(cluster, "a", route) < 150
        cluster.delay("a", "redis", 150)
        time.sleep(0.3)  # the proxy re-reads its delay every 100 ms
        assert 290 <= round_trip_ms(cluster, "a", route) < 600  # each way
        assert round_trip_ms(cluster, "b", route) < 150  # b's links are not shaped
        cluster.heal("a", "redis")
        time.sleep(0.3)
        assert round_trip_ms(cluster, "a", route) < 150

        cluster.freeze("redis")
        assert not ping(node, "b")
        cluster.thaw("redis")
        assert ping(node, "b")
        made = [ns for ns in namespaces() if ns.startswith(cluster.tag)]
        assert len(made) == 4  # three hosts and the switch
    assert not [ns for ns in namespaces() if ns.startswith(cluster.tag)]
    assert node.proc.poll() is not None


def test_loss_drops_about_its_share():
    with Cluster(["tx", "rx"]) as cluster:
        receiver = cluster.on("rx", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        sender = cluster.on("tx", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        receiver.bind((cluster.address("rx"), 9999))
        receiver.settimeout(0.05)
        cluster.loss("tx", "rx", 20)
        received = 0
        for i in range(2000):
            sender.sendto(b"x", (cluster.address("rx"), 9999))
            if i % 50 == 49:  # drained as it goes: the socket's buffer never overflows
                try:
                    while receiver.recv(8):
                        received += 1
                except socket.timeout:
                    pass
        receiver.close()
        sender.close()
    assert 1450 <= received <= 1750  # 1600 expected


def test_a_dead_runs_namespaces_are_swept():
    orphan = subprocess.Popen(["sleep", "60"])
    tag = f"ilre-{orphan.pid}-0-x"
    subprocess.run(["ip", "netns", "add", tag], check=True)
    orphan.kill()
    orphan.wait()
    sweep_stale()
    assert tag not in namespaces()
