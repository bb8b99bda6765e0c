"""The Redis queue's Lua scripts: each a step that must be atomic (keys: queue/redis_stream.py)."""

# Atomic admission and enqueue, the rules of service/common/quotas.py shared by every front end:
# KEYS: stream, the caller key's unfinished set (rid -> deadline), its GCRA state;
# ARGV: max_queue, rid, payload, deadline, key name, share limit (0 = none), rate (0 = none), burst, now, grace,
#       request id, traceparent ('' = none), document scope
# -> {1 added | 0 queue full | 2 key's share full | 3 key's rate exceeded, depth or unfinished, seconds to wait}
ADMIT = """
local n = redis.call('XLEN', KEYS[1])
if n >= tonumber(ARGV[1]) then return {0, n, '0'} end
local now, deadline, grace = tonumber(ARGV[9]), tonumber(ARGV[4]), tonumber(ARGV[10])
local limit = tonumber(ARGV[6])
if limit > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - grace)
  local mine = redis.call('ZCARD', KEYS[2])
  if mine >= limit then return {2, mine, '0'} end
end
local rate = tonumber(ARGV[7])
if rate > 0 then
  local interval = 1.0 / rate
  local start = math.max(tonumber(redis.call('GET', KEYS[3]) or now), now)
  local wait = start - now - (tonumber(ARGV[8]) - 1) * interval
  if wait > 1e-9 then return {3, n, tostring(wait)} end
  redis.call('SET', KEYS[3], tostring(start + interval), 'PX', math.ceil((start + interval - now) * 1000) + 1000)
end
redis.call('XADD', KEYS[1], '*', 'rid', ARGV[2], 'payload', ARGV[3], 'deadline', ARGV[4], 'key', ARGV[5],
           'request_id', ARGV[11], 'traceparent', ARGV[12], 'scope', ARGV[13])
if limit > 0 then
  redis.call('ZADD', KEYS[2], deadline, ARGV[2])
  local ttl = math.ceil((deadline + grace - now) * 1000)
  if redis.call('PTTL', KEYS[2]) < ttl then redis.call('PEXPIRE', KEYS[2], ttl) end
end
return {1, n + 1, '0'}
"""

# KEYS: stream, result, the key's unfinished set, done marker; ARGV: group, entry id, consumer, outcome ('' = none),
# ttl (s), rid, this delivery's token -> 1 delivered, 2 delivered already by this very call (its earlier try's reply
# was lost: the marker holds its token), 0 dropped: answered by another delivery, or pending under another consumer
FINISH = """
local marker = redis.call('GET', KEYS[4])
if marker then
  if marker == ARGV[7] then return 2 end
  return 0
end
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #p > 0 and p[1][2] ~= ARGV[3] then return 0 end
if ARGV[4] ~= '' then
  redis.call('LPUSH', KEYS[2], ARGV[4])
  redis.call('EXPIRE', KEYS[2], ARGV[5])
end
redis.call('SET', KEYS[4], ARGV[7], 'EX', ARGV[5])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[6])
return 1
"""

# KEYS: stream; ARGV: group, consumer, entry ids -> the ids no longer this consumer's (the rest re-claimed)
RENEW = """
local lost = {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #p > 0 and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
  else
    table.insert(lost, ARGV[i])
  end
end
return lost
"""

# A worker taking back what Redis handed it unread (a read whose reply was lost): its own pending entries, their
# delivery counts unchanged (XREADGROUP from id 0 would count each take-back as a delivery, and enough of them, on a
# flaky link, would dead-letter a request no worker died on); entries deleted meanwhile acknowledged.
# KEYS: stream; ARGV: group, consumer, count -> {entry id, {field, value, ...}} for each entry still there
OWN = """
local out = {}
for _, p in ipairs(redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', tonumber(ARGV[3]), ARGV[2])) do
  local got = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, p[1], 'RETRYCOUNT', p[4])
  if got[1] then table.insert(out, got[1]) else redis.call('XACK', KEYS[1], ARGV[1], p[1]) end
end
return out
"""

# An entry delivered too often moved to the dead letters with an error result for its caller, unless a delivery
# answered it meanwhile (the done marker set): then it is only acknowledged, so a caller never gets two results.
# KEYS: stream, result, the key's unfinished set, done marker, dead letters; ARGV: group, entry id, rid, outcome,
# ttl (s), then the entry's fields (field, value, ...) -> 1 dead-lettered, 0 answered already
DEAD_LETTER = """
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[3])
if redis.call('EXISTS', KEYS[4]) == 1 then return 0 end
local fields = {}
for i = 6, #ARGV do table.insert(fields, ARGV[i]) end
redis.call('XADD', KEYS[5], 'MAXLEN', '~', 10000, '*', unpack(fields))
redis.call('LPUSH', KEYS[2], ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[5])
redis.call('SET', KEYS[4], 'dead-letter', 'EX', ARGV[5])
return 1
"""
