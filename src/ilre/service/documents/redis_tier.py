"""The shared tier of the document cache on Redis: every worker reads what any worker encoded.

Keys (prefix "ilre" by default, beside the queue's):
  {p}:doc:{id}:ids          the document's token IDs (safetensors bytes, one int32 tensor "ids")
  {p}:doc:{id}:state:{key}  an encoded ContextState for prefill settings `key` (its named tensors)
  {p}:docs                  sorted set: every entry above, scored by its last use (unix s)
  {p}:docs:bytes            hash: entry -> its size in bytes
  {p}:docs:owners           hash: entry -> its owner (an opaque tag of the caller's scope, DocumentNames.owner)
Every entry expires `ttl` seconds after its last use (SET EX, refreshed by reads). A write first
drops the expired entries from the index, then evicts until the new one fits under `max_bytes`, in
turns: the writer's own entries while its owner holds more than `share` of the cap, then those of
owners over their share, then (shares oversubscribed) anyone's; within a turn the least recently used
states first, IDs only when no state is left to evict (a lost state is computed again, lost IDs make
the document_id unknown). One Lua script does it, so concurrent workers keep the sums right; an entry
larger than the cap is not stored. The cap is this store's own: Redis's maxmemory policy must not
be left to evict, it would take the request stream with it.
Failures never fail a request: they are logged and the entry counts as missing.
"""

from __future__ import annotations

import collections
import logging
import time

import torch
from redis.exceptions import RedisError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from ...engine.defaults import DOC_CACHE_SHARE
from ..common.redis_connection import sync_client

log = logging.getLogger(__name__)

# KEYS: index zset, sizes hash, owners hash, the entry; ARGV: size, now, ttl, cap, owner, share (bytes)
#   -> {stored 0|1, evicted from its own owner, evicted from others}
ADMIT = """
local index, sizes, owners, entry = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local size, now, ttl, cap = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local owner, share = ARGV[5], tonumber(ARGV[6])
local function drop(name)
  redis.call('DEL', name)
  redis.call('ZREM', index, name)
  redis.call('HDEL', sizes, name)
  redis.call('HDEL', owners, name)
end
for _, name in ipairs(redis.call('ZRANGEBYSCORE', index, '-inf', now - ttl)) do drop(name) end
drop(entry)
if size > cap then return {0, 0, 0} end
local whose, used, total = {}, {}, 0
local flat = redis.call('HGETALL', owners)
for i = 1, #flat, 2 do whose[flat[i]] = flat[i + 1] end
flat = redis.call('HGETALL', sizes)
local bytes = {}
for i = 1, #flat, 2 do
  local name, n = flat[i], tonumber(flat[i + 1])
  bytes[name] = n
  local who = whose[name] or ''
  used[who] = (used[who] or 0) + n
  total = total + n
end
used[owner] = (used[owner] or 0) + size
local own, others = 0, 0
local names = redis.call('ZRANGE', index, 0, -1)
local turns = {
  function(who) return who == owner and used[who] > share end,
  function(who) return used[who] > share end,
  function(who) return true end}
for _, turn in ipairs(turns) do
  for _, states in ipairs({true, false}) do
    for _, name in ipairs(names) do
      if total + size <= cap then break end
      local who = whose[name] or ''
      if bytes[name] and (string.find(name, ':state:', 1, true) ~= nil) == states and turn(who) then
        total = total - bytes[name]
        used[who] = used[who] - bytes[name]
        bytes[name] = nil
        drop(name)
        if who == owner then own = own + 1 else others = others + 1 end
      end
    end
  end
end
redis.call('ZADD', index, now, entry)
redis.call('HSET', sizes, entry, size)
redis.call('HSET', owners, entry, owner)
return {1, own, others}
"""


class RedisDocuments:
    """`SharedDocuments` on one Redis (synchronous: it runs on the engine thread)."""

    def __init__(self, url: str, prefix: str = "ilre", max_bytes: int = 2 << 30, ttl_s: int = 3600,
                 share: float = DOC_CACHE_SHARE):
        self.client = sync_client(url, socket_timeout=10, socket_connect_timeout=2)
        self.prefix, self.max_bytes, self.ttl_s, self.share = prefix, max_bytes, ttl_s, share
        self.index, self.sizes, self.owners = f"{prefix}:docs", f"{prefix}:docs:bytes", f"{prefix}:docs:owners"
        self._admit = self.client.register_script(ADMIT)
        self.evictions = 0
        self.evicted: collections.Counter = collections.Counter()  # by cause: own, pressure

    def _ids_key(self, doc: str) -> str:
        return f"{self.prefix}:doc:{doc}:ids"

    def _state_key(self, doc: str, key: str) -> str:
        return f"{self.prefix}:doc:{doc}:state:{key}"

    def get_ids(self, doc: str) -> torch.Tensor | None:
        tensors = self._get(self._ids_key(doc))
        return None if tensors is None else tensors["ids"].to(torch.int64)

    def put_ids(self, doc: str, ids: torch.Tensor, owner: str = "") -> None:
        self._put(self._ids_key(doc), {"ids": ids.to(torch.int32).cpu().contiguous()}, owner)

    def get_state(self, doc: str, key: str) -> dict[str, torch.Tensor] | None:
        return self._get(self._state_key(doc, key))

    def put_state(self, doc: str, key: str, tensors: dict[str, torch.Tensor], owner: str = "") -> None:
        self._put(self._state_key(doc, key), {name: t.cpu() for name, t in tensors.items()}, owner)

    def put_prefix(self, prefix: str, doc: str) -> None:
        """Name `doc` as the document whose encoding a longer context with the prefix `prefix` (a slot) takes on
        (a few bytes, outside the byte cap, expiring with the documents)."""
        try:
            self.client.set(f"{self.prefix}:prefix:{prefix}", doc, ex=self.ttl_s)
        except RedisError as exc:
            log.warning("shared document cache: cannot store prefix %s (%s)", prefix, exc)

    def get_prefixes(self, prefixes: list[str]) -> list[str | None]:
        """The documents `put_prefix` named for each of `prefixes`, in one round trip (None: none)."""
        try:
            found = self.client.mget([f"{self.prefix}:prefix:{p}" for p in prefixes]) if prefixes else []
        except RedisError as exc:
            log.warning("shared document cache: cannot read prefixes (%s)", exc)
            return [None] * len(prefixes)
        return [None if doc is None else (doc.decode() if isinstance(doc, bytes) else doc) for doc in found]

    def _get(self, name: str) -> dict[str, torch.Tensor] | None:
        try:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.get(name).expire(name, self.ttl_s).zadd(self.index, {name: time.time()}, xx=True)
                raw = pipe.execute()[0]
            return None if raw is None else load_tensors(raw)
        except (RedisError, ValueError, RuntimeError) as exc:  # unreachable, or bytes that do not parse
            log.warning("shared document cache: cannot read %s (%s)", name, exc)
            return None

    def _put(self, name: str, tensors: dict[str, torch.Tensor], owner: str) -> None:
        blob = save_tensors(tensors)
        try:
            stored, own, others = self._admit(keys=[self.index, self.sizes, self.owners, name],
                                              args=[len(blob), time.time(), self.ttl_s, self.max_bytes, owner,
                                                    int(self.share * self.max_bytes)])
            self.evictions += int(own) + int(others)
            self.evicted["own"] += int(own)
            self.evicted["pressure"] += int(others)
            if stored:
                self.client.set(name, blob, ex=self.ttl_s)
        except RedisError as exc:
            log.warning("shared document cache: cannot store %s (%s)", name, exc)

    def close(self) -> None:
        self.client.close()
