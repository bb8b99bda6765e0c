"""Redis clients from one URL (service/common/redis_url.py): a single server, or the master of a
Sentinel-managed group.

With Sentinel, every new connection asks the sentinels where the master is, and a connection that
finds its server gone (or demoted to a replica: READONLY) is dropped, so clients follow a failover
by themselves.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from .redis_url import RedisTarget, parse_redis_url

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
    return sentinel.master_for(target.master, redis_class=redis_class, db=target.db, username=target.username,
                               password=target.password, **options)


def _sentinel_kwargs(target: RedisTarget, options: dict[str, Any]) -> dict[str, Any]:
    """Connection settings of the sentinels themselves: short timeouts, their own password."""
    out: dict[str, Any] = {"socket_connect_timeout": options.get("socket_connect_timeout", 2.0),
                           "socket_timeout": 2.0, "decode_responses": True, "retry": options["retry"]}
    if target.sentinel_password:
        out["password"] = target.sentinel_password
    return out
