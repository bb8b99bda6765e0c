"""The service's processes on hosts of a Cluster (test support): redis-server, a Sentinel group across
three hosts, `ilre worker` and `ilre serve`, each inside its host, reached at the host's address."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Callable

import redis

from .cluster import Cluster

REDIS_PORT, SENTINEL_PORT, HTTP_PORT = 6379, 26379, 8080
MASTER_NAME = "ilre"


def redis_binary() -> str:
    from tests.service.conftest import redis_server_binary

    binary = redis_server_binary()
    if binary is None:
        raise RuntimeError("redis-server not found: `make tools` installs one (deploy/test-tools.sh)")
    return binary


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


class Logged:
    """A process on a host whose stderr is kept (last lines) for failure messages."""

    def __init__(self, cluster: Cluster, host: str, argv: list[str], env: dict[str, str] | None = None):
        self.cluster, self.host = cluster, host
        self.proc = cluster.spawn(host, argv, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)  # all of them: a host's process lives for one test module

    def tail(self) -> str:
        return "".join(self.lines[-40:])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 60) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class RedisHost(Logged):
    """redis-server on `host` (AOF on, as the loopback tests' RedisServer), answering on its address."""

    def __init__(self, cluster: Cluster, host: str, *extra: str):
        self.dir = cluster.work / f"redis-{host}"
        self.dir.mkdir(exist_ok=True)
        super().__init__(cluster, host, [
            redis_binary(), "--port", str(REDIS_PORT), "--bind", "0.0.0.0", "--dir", str(self.dir),
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--protected-mode", "no", *extra])
        self.address = cluster.address(host)
        wait_until(lambda: self.call(host, lambda r: r.ping()), 20, f"redis-server on {host}")

    @property
    def url(self) -> str:
        return f"redis://{self.address}:{REDIS_PORT}/0"

    def call(self, viewer: str, fn: Callable[[redis.Redis], object], timeout: float = 5.0) -> object:
        """fn(client) with a fresh client made on host `viewer` (so a cut link shows as one)."""
        def run():
            with redis.Redis(host=self.address, port=REDIS_PORT, decode_responses=True, socket_timeout=timeout, retry=None,
                             socket_connect_timeout=timeout) as client:
                return fn(client)
        return self.cluster.on(viewer, run)


class SentinelHosts:
    """A master on hosts[0], replicas on the others, a sentinel on each (quorum 2); `url` names them all."""

    def __init__(self, cluster: Cluster, hosts: list[str], down_after_ms: int = 2000, *redis_extra: str):
        self.cluster, self.hosts = cluster, hosts
        master = cluster.address(hosts[0])
        self.nodes = {hosts[0]: RedisHost(cluster, hosts[0], *redis_extra)}
        for host in hosts[1:]:
            self.nodes[host] = RedisHost(cluster, host, "--replicaof", master, str(REDIS_PORT), *redis_extra)
        for host in hosts[1:]:
            wait_until(lambda: self.nodes[host].call(host, lambda r: r.info("replication")["master_link_status"] == "up"),
                       30, f"the replica on {host} to sync")
        self.sentinels = {}
        for host in hosts:
            conf = cluster.work / f"sentinel-{host}.conf"
            conf.write_text(
                f"port {SENTINEL_PORT}\nbind 0.0.0.0\nprotected-mode no\ndir {cluster.work}\n"
                f"sentinel announce-ip {cluster.address(host)}\n"
                f"sentinel monitor {MASTER_NAME} {master} {REDIS_PORT} 2\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} {down_after_ms}\n"
                f"sentinel failover-timeout {MASTER_NAME} 10000\nsentinel parallel-syncs {MASTER_NAME} 2\n")
            self.sentinels[host] = Logged(cluster, host, [redis_binary(), str(conf), "--sentinel"])
        wait_until(self._settled, 60, "the sentinels to see each other and the replicas", interval=0.3)

    @property
    def url(self) -> str:
        nodes = ",".join(f"{self.cluster.address(h)}:{SENTINEL_PORT}" for h in self.hosts)
        return f"redis+sentinel://{nodes}/{MASTER_NAME}/0"

    def sentinel_call(self, host: str, *command: str) -> object:
        def run():
            with redis.Redis(host=self.cluster.address(host), port=SENTINEL_PORT, decode_responses=True,
                             socket_timeout=3) as client:
                return client.execute_command(*command)
        return self.cluster.on(host, run)

    def _settled(self) -> bool:
        for host in self.hosts:
            info = self.sentinel_call(host, "SENTINEL", "MASTER", MASTER_NAME)
            fields = dict(zip(info[::2], info[1::2])) if isinstance(info, list) else info
            if int(fields["num-other-sentinels"]) < len(self.hosts) - 1 or int(fields["num-slaves"]) < len(self.hosts) - 1:
                return False
        return True

    def master(self) -> str:
        """The host the sentinels (asked from the first live one) name as master."""
        for host in self.hosts:
            try:
                address, _ = self.sentinel_call(host, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
            except redis.RedisError:
                continue
            return next(h for h in self.hosts if self.cluster.address(h) == address)
        raise RuntimeError("no sentinel answers")


class IlreHost(Logged):
    """`ilre worker` or `ilre serve` on `host`, with ILRE_* settings from `env`."""

    def __init__(self, cluster: Cluster, host: str, command: str, redis_url: str, *args: str,
                 env: dict[str, str] | None = None, ready: str | None = None):
        argv = [sys.executable, "-m", "ilre.cli", command, "--redis-url", redis_url, *args]
        if command == "serve":
            argv += ["--host", "0.0.0.0", "--http-port", str(HTTP_PORT), "--grpc-port", "0"]
        super().__init__(cluster, host, argv, env={"ILRE_LOG_LEVEL": "info", **(env or {})})
        if ready:
            wait_until(lambda: self._ready(ready), 300, f"`ilre {command}` on {host}", interval=0.2)

    def _ready(self, marker: str) -> bool:
        if not self.alive():
            raise RuntimeError(f"ilre on {self.host} exited: {self.tail()}")
        return any(marker in line for line in self.lines)

    @property
    def http_url(self) -> str:
        return f"http://{self.cluster.address(self.host)}:{HTTP_PORT}"


def worker_on(cluster: Cluster, host: str, redis: RedisHost | SentinelHosts, prefix: str, *args: str,
              redis_url: str | None = None, env: dict[str, str] | None = None) -> IlreHost:
    """An `ilre worker --threads 1` named after its host, registered before this returns."""
    worker = IlreHost(cluster, host, "worker", redis_url or redis.url, "--redis-prefix", prefix, "--name", host,
                      "--threads", "1", *args, env=env)
    node = redis if isinstance(redis, RedisHost) else redis.nodes[redis.master()]
    wait_until(lambda: worker._ready("") and node.call(node.host, lambda r: r.exists(f"{prefix}:worker:{host}")), 300,
               f"the worker on {host} to register", interval=0.3)
    return worker


def serve_on(cluster: Cluster, host: str, redis_url: str, prefix: str, *args: str,
             env: dict[str, str] | None = None) -> IlreHost:
    """`ilre serve` on `host` in front of the Redis queue, listening on its address."""
    return IlreHost(cluster, host, "serve", redis_url, "--redis-prefix", prefix, *args, env=env,
                    ready="ilre: gRPC on")
