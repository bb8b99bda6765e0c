"""The Lua scripts of the shared document tier (service/documents/redis_tier.py), one call each, so that concurrent
workers keep the sums right.

Besides the entries and the index every entry is in (`{p}:docs`, scored by last use), the store keeps what eviction
reads as entries change: each owner's bytes (`{p}:docs:used`) and, per kind ("s": states, "i": IDs) and owner, a
sorted set of that owner's entries by last use (`{p}:docs:lru:{kind}:{owner}`). A write then reads the owners'
totals and the oldest entry of each owner it may evict from, not every entry held: its cost does not grow with the
entries a long job leaves (each document's IDs stay while states come and go). A store written before these keys
existed is taken over by the first write (one pass over its index).

Every script's KEYS: the index, the sizes hash, the owners hash, the owners' bytes hash; ARGV[1]: the prefix of the
per-owner sorted sets.
"""

PRELUDE = """
local index, sizes, owners, used_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local lru_prefix = ARGV[1]
local function kind(name)
  if string.find(name, ':state:', 1, true) then return 's' end
  return 'i'
end
local function lru(who, k) return lru_prefix .. k .. ':' .. who end
local function take_over()
  if redis.call('EXISTS', used_key) == 1 or redis.call('HLEN', sizes) == 0 then return end
  local flat = redis.call('ZRANGE', index, 0, -1, 'WITHSCORES')
  for i = 1, #flat, 2 do
    local name = flat[i]
    local n = redis.call('HGET', sizes, name)
    if n then
      local who = redis.call('HGET', owners, name) or ''
      redis.call('ZADD', lru(who, kind(name)), flat[i + 1], name)
      redis.call('HINCRBY', used_key, who, n)
    end
  end
end
local function drop(name)
  local n, who = redis.call('HGET', sizes, name), redis.call('HGET', owners, name) or ''
  redis.call('DEL', name)
  redis.call('ZREM', index, name)
  redis.call('HDEL', sizes, name)
  redis.call('HDEL', owners, name)
  redis.call('ZREM', lru(who, kind(name)), name)
  if n and redis.call('HINCRBY', used_key, who, -tonumber(n)) <= 0 then redis.call('HDEL', used_key, who) end
end
"""

# KEYS: +the entry; ARGV: +size, now, ttl, cap, owner, share (bytes) -> {stored 0|1, evicted from its own owner, evicted
# from others}. Drops the expired entries and the entry's older copy, then evicts in turns (the writer's own while its
# owner is over its share, owners over their share, anyone), within a turn states before IDs, each the least recently
# used first across the owners the turn takes.
ADMIT = PRELUDE + """
local entry = KEYS[5]
local size, now, ttl, cap = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local owner, share = ARGV[6], tonumber(ARGV[7])
take_over()
for _, name in ipairs(redis.call('ZRANGEBYSCORE', index, '-inf', now - ttl)) do drop(name) end
drop(entry)
if size > cap then return {0, 0, 0} end
local used, total = {}, 0
local flat = redis.call('HGETALL', used_key)
for i = 1, #flat, 2 do
  used[flat[i]] = tonumber(flat[i + 1])
  total = total + used[flat[i]]
end
used[owner] = (used[owner] or 0) + size
local own, others = 0, 0
local turns = {
  function(who) return who == owner and used[who] > share end,
  function(who) return used[who] > share end,
  function(who) return true end}
for _, turn in ipairs(turns) do
  for _, k in ipairs({'s', 'i'}) do
    while total + size > cap do
      local best, best_score, best_who = nil, nil, nil
      for who, _ in pairs(used) do
        if turn(who) then
          local head = redis.call('ZRANGE', lru(who, k), 0, 0, 'WITHSCORES')
          local score = tonumber(head[2])
          if head[1] and (best == nil or score < best_score or (score == best_score and head[1] < best)) then
            best, best_score, best_who = head[1], score, who
          end
        end
      end
      if best == nil then break end
      local n = tonumber(redis.call('HGET', sizes, best)) or 0
      total = total - n
      used[best_who] = used[best_who] - n
      drop(best)
      redis.call('ZREM', lru(best_who, k), best)
      if best_who == owner then own = own + 1 else others = others + 1 end
    end
  end
end
redis.call('ZADD', index, now, entry)
redis.call('HSET', sizes, entry, size)
redis.call('HSET', owners, entry, owner)
redis.call('ZADD', lru(owner, kind(entry)), now, entry)
redis.call('HINCRBY', used_key, owner, size)
return {1, own, others}
"""

# KEYS: +the entry; ARGV: +now, ttl -> the entry's bytes (nil: not there), its expiry and last use refreshed.
READ = PRELUDE + """
local entry = KEYS[5]
local blob = redis.call('GET', entry)
if blob then
  redis.call('EXPIRE', entry, ARGV[3])
  local who = redis.call('HGET', owners, entry)
  if who then
    redis.call('ZADD', index, 'XX', ARGV[2], entry)
    redis.call('ZADD', lru(who, kind(entry)), 'XX', ARGV[2], entry)
  end
end
return blob
"""

# KEYS: +the entry -> 0: the entry and its counts gone.
DROP = PRELUDE + """
drop(KEYS[5])
return 0
"""
