"""Redis clients from one URL (service/common/redis_url.py): a single server, or the master of a
Sentinel-managed group.

With Sentinel, every new connection asks the sentinels where the master is, and a connection that
finds its server gone (or demoted to a replica: READONLY) is dropped, so clients follow a failover
by themselves.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelManagedConnection as AsyncSentinelConnection
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection

from .redis_url import RedisTarget, parse_redis_url

log = logging.getLogger(__name__)

FOLLOW_S = 1.0  # how often a Sentinel client asks the sentinels where the master is (MasterFollower)
CALL_S = 3.0  # the longest any one Redis call may take before it counts as failed (a dead socket)
# The client library's own retries are off (redis-py 8 retries a failed call up to 10 times by default, which would
# multiply CALL_S): every caller here has its own retry loop, bounded by its own setting (redis_retry_s).
LIBRARY_RETRIES = 0


def async_client(url: str, **options: Any) -> aioredis.Redis:
    """An asyncio client of the server, or of the Sentinel group's current master."""
    return _client(url, aioredis.Redis, AsyncSentinel, options)


def sync_client(url: str, **options: Any) -> redis.Redis:
    """A blocking client of the server, or of the Sentinel group's current master."""
    return _client(url, redis.Redis, Sentinel, options)


def _client(url: str, redis_class: type, sentinel_class: type, options: dict[str, Any]) -> Any:
    target = parse_redis_url(url)
    retry = AsyncRetry if redis_class is aioredis.Redis else Retry
    options = {"retry": retry(NoBackoff(), LIBRARY_RETRIES), **options}
    if not target.sentinel:
        return redis_class.from_url(url, **options)
    sentinel = sentinel_class(list(target.sentinels), sentinel_kwargs=_sentinel_kwargs(target, options))
    connection = _AsyncMasterConnection if redis_class is aioredis.Redis else _MasterConnection
    return sentinel.master_for(target.master, redis_class=redis_class, db=target.db, username=target.username,
                               password=target.password, connection_class=connection, **options)


class _MasterConnection(SentinelManagedConnection):
    """A connection to a Sentinel group's master that, when it reconnects by itself (a command sent on a closed
    socket), goes to where the pool last found the master, not to the server it was on (the library's own reconnect
    keeps the old address, so a connection closed by a move would open again on the old master)."""

    def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        _aim(self)
        super().connect_check_health(*args, **kwargs)


class _AsyncMasterConnection(AsyncSentinelConnection):
    """`_MasterConnection` for asyncio clients."""

    async def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        _aim(self)
        await super().connect_check_health(*args, **kwargs)


def _aim(connection: Any) -> None:
    pool = connection.connection_pool
    if pool.is_master and pool.master_address is not None:
        connection.host, connection.port = pool.master_address


def _sentinel_kwargs(target: RedisTarget, options: dict[str, Any]) -> dict[str, Any]:
    """Connection settings of the sentinels themselves: short timeouts, their own password."""
    out: dict[str, Any] = {"socket_connect_timeout": options.get("socket_connect_timeout", 2.0),
                           "socket_timeout": 2.0, "decode_responses": True, "retry": options["retry"]}
    if target.sentinel_password:
        out["password"] = target.sentinel_password
    return out


class MasterFollower:
    """For a Sentinel group's client: where the sentinels say the master is, and the client's connections dropped
    (idle and in use) when it has moved, so that no call stays on the old master (demoted only at the sentinels'
    next round, seconds after a split heals); a call cut short fails and its caller's own loop sends it again, to
    the new master. `also`: other clients of the same group (e.g. the shared document tier's blocking one), moved
    with it. For a single server it does nothing."""

    def __init__(self, client: aioredis.Redis, *also: Any):
        self.pool = client.connection_pool
        self.sentinels, self.name = getattr(self.pool, "sentinel_manager", None), getattr(self.pool, "service_name", None)
        self.also = [c.connection_pool for c in also if getattr(c.connection_pool, "sentinel_manager", None)]
        self.known: tuple[str, int] | None = None

    async def check(self) -> bool:
        """Ask every sentinel now (a WAIT shortfall, a heartbeat) and go by the address most of them give (a sentinel
        cut off with the old master still names it until the others' next hello reaches it); the sentinels that
        agree are put first in every client's list, so that new connections find that master too. Whether the master
        had moved (then the clients reconnected)."""
        if self.sentinels is None or self.name is None:
            return False
        answers = await asyncio.gather(*(self._ask(s) for s in self.sentinels.sentinels))
        votes = collections.Counter(a for a in answers if a is not None)
        if not votes:  # no sentinel reachable (this side of a split): ask again later
            return False
        address = votes.most_common(1)[0][0]
        agree = {_address(s) for s, a in zip(self.sentinels.sentinels, answers) if a == address}
        for pool in (self.pool, *self.also):
            pool.sentinel_manager.sentinels.sort(key=lambda s: _address(s) not in agree)
        moved = self.known is not None and address != self.known
        if moved:
            log.warning("Redis master moved from %s:%s to %s:%s: reconnecting", *self.known, *address)
            for pool in (self.pool, *self.also):  # where their connections reopen (_MasterConnection)
                getattr(pool, "proxy", pool).master_address = address  # (a blocking client's pool keeps it in a proxy)
            await self.pool.disconnect(inuse_connections=True)
            for pool in self.also:  # a blocking client: its calls in flight fail and are sent again
                pool.disconnect(inuse_connections=True)
        self.known = address
        return moved

    async def _ask(self, sentinel: Any) -> tuple[str, int] | None:
        """One sentinel's master address, None where it does not answer in time."""
        try:
            found = await asyncio.wait_for(sentinel.sentinel_get_master_addr_by_name(self.name), 2.0)
        except Exception:
            return None
        return (str(found[0]), int(found[1])) if found else None

    async def run(self, period: float = FOLLOW_S) -> None:
        """`check` every `period` s, until cancelled (returns at once for a single server)."""
        if self.sentinels is None:
            return
        while True:
            try:
                await self.check()
            except Exception:  # never let one failed round stop the following
                log.exception("following the Redis master: the sentinels' answer could not be applied")
            await asyncio.sleep(period)


def _address(sentinel: Any) -> tuple[str, int]:
    """Where a sentinel client connects."""
    kwargs = sentinel.connection_pool.connection_kwargs
    return str(kwargs.get("host")), int(kwargs.get("port", 26379))
