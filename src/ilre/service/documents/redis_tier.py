"""The shared tier of the document cache on Redis: every worker reads what any worker encoded.

Keys (prefix "ilre" by default, beside the queue's):
  {p}:doc:{id}:ids          the document's token IDs (safetensors bytes, one int32 tensor "ids")
  {p}:doc:{id}:state:{key}  an encoded ContextState for prefill settings `key` (its named tensors)
  {p}:docs                  sorted set: every entry above, scored by its last use (unix s)
  {p}:docs:bytes            hash: entry -> its size in bytes
  {p}:docs:owners           hash: entry -> its owner (an opaque tag of the caller's scope, DocumentNames.owner)
  {p}:docs:used             hash: owner -> the bytes its entries are charged
  {p}:docs:lru:{s|i}:{owner} sorted sets: the owner's states (s) and IDs (i), scored by last use
An entry is charged what Redis holds for it, not only its value: ENTRY_OVERHEAD and its name's copies for its
key, expiry, index, order and hash fields, and 1/128 of the value for the allocator's rounding, so that the cap
bounds the tier's share of Redis's used memory (`charged`).
Every entry expires `ttl` seconds after its last use (SET EX, refreshed by reads). A write first
drops the expired entries from the index, then evicts until the new one fits under `max_bytes`, in
turns: the writer's own entries while its owner holds more than `share` of the cap, then those of
owners over their share, then (shares oversubscribed) anyone's; within a turn the least recently used
states first, IDs only when no state is left to evict (a lost state is computed again, lost IDs make
the document_id unknown). Lua scripts do it (service/documents/redis_scripts.py), reading only the owners'
totals and the oldest entries of those it may evict from, so concurrent workers keep the sums right and a write
costs the same however many entries are held; an entry larger than the cap is not stored. The cap is this store's
own: Redis's maxmemory policy must not be left to evict, it would take the request stream with it.
A document's IDs are what its document_id (and a gateway retrieve hash) stand on, so they are kept
through a failover: their reads and writes ride out an unreachable Redis for up to `retry_s`, and a
write waits (WAIT, same connection) until `wait_replicas` replicas hold it, within `wait_ms`. Encoded
states are a cache: a failed read or write of one is given up at once (the state is computed again).
Failures never fail a request: they are logged, counted (`at_risk`), and the entry counts as missing.
Every call is bounded (CALL_S, the queue's bound), and once one fails the cache calls (states, prefixes)
skip Redis for OUTAGE_S (counted in `skipped`): a worker cut from Redis computes its request at about its
usual pace, paying one failed call and its IDs' ride-out, not a timeout per lookup.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Callable, TypeVar

import torch
from redis.exceptions import RedisError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from ...contract.defaults import DOC_CACHE_SHARE
from ..common.redis_connection import CALL_S, sync_client
from .redis_scripts import ADMIT, DROP, READ

log = logging.getLogger(__name__)
T = TypeVar("T")
RETRY_PAUSE_S = 0.2  # between tries of a read or write of IDs while Redis is failing
ENTRY_OVERHEAD = 512  # bytes Redis holds per entry besides its value and its name's copies: key, expiry, index entries
NAME_COPIES = 6  # an entry's name is held as its key, in the index (twice), its owner's order (twice) and the hashes
OUTAGE_S = 5.0  # after a failed call, reads and writes of states and prefixes skip Redis this long


def charged(length: int, name: str) -> int:
    """Bytes of Redis's used memory an entry whose value is `length` bytes, stored under `name`, is charged: the
    value, 1/128 of it for the allocator's rounding, ENTRY_OVERHEAD and NAME_COPIES bytes per character of its name
    (Redis's used memory grows by about 460 bytes plus 5.6 per character of the name beyond each value: this charges a
    little more; tests/engine/test_documents.py holds it to that)."""
    return length + length // 128 + ENTRY_OVERHEAD + NAME_COPIES * len(name)


class RedisDocuments:
    """`SharedDocuments` on one Redis (synchronous: it runs on the engine thread)."""

    def __init__(self, url: str, prefix: str = "ilre", max_bytes: int = 2 << 30, ttl_s: int = 3600,
                 share: float = DOC_CACHE_SHARE, *, wait_replicas: int = 0, wait_ms: int = 1000, retry_s: float = 5.0):
        self.client = sync_client(url, socket_timeout=CALL_S, socket_connect_timeout=2)
        self.prefix, self.max_bytes, self.ttl_s, self.share = prefix, max_bytes, ttl_s, share
        self.wait_replicas, self.wait_ms, self.retry_s = wait_replicas, wait_ms, retry_s
        # IDs whose write fewer than wait_replicas replicas acknowledged in time ("unconfirmed"), or that could not
        # be written or read within retry_s ("unstored", "unread")
        self.at_risk: collections.Counter = collections.Counter()
        self.index, self.sizes, self.owners = f"{prefix}:docs", f"{prefix}:docs:bytes", f"{prefix}:docs:owners"
        self.used, self.lru_prefix = f"{prefix}:docs:used", f"{prefix}:docs:lru:"
        self._admit, self._read, self._drop = map(self.client.register_script, (ADMIT, READ, DROP))
        self.evictions = 0
        self.evicted: collections.Counter = collections.Counter()  # by cause: own, pressure
        self.skipped = 0  # cache calls not made: Redis had failed within OUTAGE_S
        self._down_until = 0.0  # time.monotonic() before which cache calls skip Redis

    def _skip(self) -> bool:
        """Whether a cache call (a state, a prefix) skips Redis now: another call failed within OUTAGE_S."""
        if time.monotonic() < self._down_until:
            self.skipped += 1
            return True
        return False

    def _failed(self, what: str, exc: Exception) -> None:
        """Log a failed call and start (or extend) the outage during which cache calls skip Redis."""
        if time.monotonic() >= self._down_until:
            log.warning("shared document cache: %s failed (%s); states and prefixes skip Redis for %g s",
                        what, type(exc).__name__, OUTAGE_S)
        self._down_until = time.monotonic() + OUTAGE_S

    def _ids_key(self, doc: str) -> str:
        return f"{self.prefix}:doc:{doc}:ids"

    def _state_key(self, doc: str, key: str) -> str:
        return f"{self.prefix}:doc:{doc}:state:{key}"

    def get_ids(self, doc: str) -> torch.Tensor | None:
        """(L,) int64 IDs of `doc`, or None (not there, or Redis unreachable for `retry_s`)."""
        tensors = self._get(self._ids_key(doc), self.retry_s)
        return None if tensors is None else tensors["ids"].to(torch.int64)

    def put_ids(self, doc: str, ids: torch.Tensor, owner: str = "") -> None:
        """Store (L,) IDs of `doc`, riding out an outage for `retry_s` and waiting for `wait_replicas` replicas."""
        self._put(self._ids_key(doc), {"ids": ids.to(torch.int32).cpu().contiguous()}, owner, durable=True)

    def get_state(self, doc: str, key: str) -> dict[str, torch.Tensor] | None:
        return self._get(self._state_key(doc, key))

    def put_state(self, doc: str, key: str, tensors: dict[str, torch.Tensor], owner: str = "") -> None:
        self._put(self._state_key(doc, key), {name: t.cpu() for name, t in tensors.items()}, owner)

    def drop_state(self, doc: str, key: str) -> None:
        """Forget `doc`'s state `key` (its bytes leave the cap's count); best effort, as every write."""
        name = self._state_key(doc, key)
        self._best_effort(f"dropping {name}", lambda: self._drop(keys=self._keys(name), args=[self.lru_prefix]), None)

    def _keys(self, name: str) -> list[str]:
        """The scripts' KEYS for entry `name` (service/documents/redis_scripts.py)."""
        return [self.index, self.sizes, self.owners, self.used, name]

    def put_prefix(self, prefix: str, doc: str) -> None:
        """Name `doc` as the document whose encoding a longer context with the prefix `prefix` (a slot) takes on
        (a few bytes, outside the byte cap, expiring with the documents)."""
        self._best_effort(f"storing prefix {prefix}",
                          lambda: self.client.set(f"{self.prefix}:prefix:{prefix}", doc, ex=self.ttl_s), None)

    def get_prefixes(self, prefixes: list[str]) -> list[str | None]:
        """The documents `put_prefix` named for each of `prefixes`, in one round trip (None: none)."""
        if not prefixes:
            return []
        found = self._best_effort("reading prefixes", lambda: self.client.mget(
            [f"{self.prefix}:prefix:{p}" for p in prefixes]), [None] * len(prefixes))
        return [None if doc is None else (doc.decode() if isinstance(doc, bytes) else doc) for doc in found]

    def _best_effort(self, what: str, call: Callable[[], T], fallback: T) -> T:
        """`call()` once, or `fallback` within an outage (not sent) or when Redis fails it (an outage starts)."""
        if self._skip():
            return fallback
        try:
            return call()
        except RedisError as exc:
            self._failed(what, exc)
            return fallback

    def _retrying(self, call: Callable[[], T], retry_s: float) -> T:
        """`call()`, again every RETRY_PAUSE_S while Redis fails (a failover: no master yet, or a connection to
        the old one) until `retry_s` has passed; then its RedisError."""
        give_up = time.monotonic() + retry_s
        while True:
            try:
                return call()
            except RedisError:
                if time.monotonic() >= give_up:
                    raise
            time.sleep(RETRY_PAUSE_S)

    def _get(self, name: str, retry_s: float = 0.0) -> dict[str, torch.Tensor] | None:
        def read() -> bytes | None:
            return self._read(keys=self._keys(name), args=[self.lru_prefix, time.time(), self.ttl_s])

        if not retry_s and self._skip():
            return None
        try:
            raw = self._retrying(read, retry_s)
            return None if raw is None else load_tensors(raw)
        except RedisError as exc:  # unreachable
            self._failed(f"reading {name}", exc)
            if retry_s:
                self.at_risk["unread"] += 1
        except (ValueError, RuntimeError) as exc:  # bytes that do not parse
            log.warning("shared document cache: cannot read %s (%s)", name, exc)
        return None

    def _put(self, name: str, tensors: dict[str, torch.Tensor], owner: str, durable: bool = False) -> None:
        """Admit and store one entry; `durable`: ride out an outage for retry_s and WAIT for the replicas."""
        if not durable and self._skip():
            return
        blob = save_tensors(tensors)
        wait = self.wait_replicas if durable else 0

        def write() -> int | None:  # replicas holding the entry (None: not stored, larger than the cap)
            stored, own, others = self._admit(keys=self._keys(name),
                                              args=[self.lru_prefix, charged(len(blob), name), time.time(), self.ttl_s,
                                                    self.max_bytes, owner, int(self.share * self.max_bytes)])
            self.evictions += int(own) + int(others)
            self.evicted["own"] += int(own)
            self.evicted["pressure"] += int(others)
            if not stored:
                return None
            with self.client.pipeline(transaction=False) as pipe:  # one connection: WAIT counts this write
                pipe.set(name, blob, ex=self.ttl_s)
                if wait:
                    pipe.execute_command("WAIT", wait, self.wait_ms)
                done = pipe.execute()
            return int(done[-1]) if wait else 0

        try:
            replicas = self._retrying(write, self.retry_s if durable else 0.0)
        except RedisError as exc:
            self._failed(f"storing {name}", exc)
            if durable:
                self.at_risk["unstored"] += 1
            return
        if replicas is not None and replicas < wait:
            self.at_risk["unconfirmed"] += 1
            log.warning("shared document cache: %s reached %d Redis replica(s) within %d ms, %d wanted "
                        "(redis_wait_replicas): a failover now could lose it", name, replicas, self.wait_ms, wait)

    def close(self) -> None:
        self.client.close()
