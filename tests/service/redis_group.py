"""A Sentinel-managed Redis group on loopback for the failover tests: a master, replicas and three
sentinels, each a real redis-server process in its own directory."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import redis

from .conftest import RedisServer, free_port, wait_for

MASTER_NAME = "ilre"
DOWN_AFTER_MS = 1000  # how long the master may be silent before sentinels call it down


class Sentinel:
    """`redis-server sentinel.conf --sentinel` watching MASTER_NAME."""

    def __init__(self, binary: str, directory: Path, master_port: int, quorum: int):
        self.port, self.dir = free_port(), directory
        directory.mkdir(parents=True, exist_ok=True)
        self.config = directory / "sentinel.conf"
        self.config.write_text(
            f"port {self.port}\nbind 127.0.0.1\nprotected-mode no\ndir {directory}\n"
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} {quorum}\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {MASTER_NAME} 4000\nsentinel parallel-syncs {MASTER_NAME} 2\n")
        self.proc = subprocess.Popen([binary, str(self.config), "--sentinel"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True, socket_timeout=2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(20)


class SentinelGroup:
    """Master + `replicas` replicas + 3 sentinels (quorum 2); `url` is the redis+sentinel:// form."""

    def __init__(self, directory: Path, replicas: int = 2):
        self.master = RedisServer(directory / "master")
        (directory / "master").mkdir(parents=True)
        self.nodes = [self.master]
        for i in range(replicas):
            (directory / f"replica{i}").mkdir()
            self.nodes.append(RedisServer(directory / f"replica{i}", "--replicaof", "127.0.0.1", str(self.master.port)))
        for node in self.nodes:
            node.start()
        for node in self.nodes[1:]:
            wait_for(lambda: node.client().info("replication").get("master_link_status") == "up", 30,
                     f"replica on {node.port} to sync")
        self.sentinels = [Sentinel(self.master.binary, directory / f"sentinel{i}", self.master.port, 2) for i in range(3)]
        wait_for(self._settled, 60, "the sentinels to see each other and the replicas", interval=0.2)

    def _settled(self) -> bool:
        try:
            for sentinel in self.sentinels:
                state = sentinel.client().sentinel_master(MASTER_NAME)
                if state["num-other-sentinels"] < 2 or state["num-slaves"] < len(self.nodes) - 1:
                    return False
            return True
        except redis.RedisError:
            return False

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}/0"

    def master_port(self) -> int | None:
        """The master's port as the sentinels' majority reports it."""
        ports = []
        for sentinel in self.sentinels:
            try:
                ports.append(int(sentinel.client().sentinel_get_master_addr_by_name(MASTER_NAME)[1]))
            except (redis.RedisError, TypeError):
                pass
        return max(set(ports), key=ports.count) if ports else None

    def node(self, port: int) -> RedisServer:
        return next(n for n in self.nodes if n.port == port)

    def kill_master(self) -> RedisServer:
        """SIGKILL the current master (no shutdown, no last write to disk); -> that node."""
        node = self.node(self.master_port())
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(20)
        return node

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for node in self.nodes:
            node.stop()
