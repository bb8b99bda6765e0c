"""Per-key fairness: a rate limit (GCRA, a token bucket without a timer) and a share of the queue.

`KeyQuotas` keeps both in process (the in-process queue, one front end); the Redis queue keeps the
same two rules in Redis, shared by every front end (queue/redis_stream.py, ADMIT), and tests check
that both give the same answers. A refusal is RESOURCE_EXHAUSTED (HTTP 429) with the seconds after
which a retry can succeed, and a message naming the limit.

GCRA: a key with rate r and burst b has an emission interval T = 1/r and a tolerance (b - 1) T;
its state is the theoretical arrival time `tat`. A request at time t is accepted when
max(tat, t) - t <= (b - 1) T, and then tat = max(tat, t) + T; otherwise it may retry after
max(tat, t) - t - (b - 1) T seconds.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict

from .errors import Code, ServiceError
from .keys import KeyPolicy

QUEUE_RETRY_S = 1.0  # retry hint when a key's share of the queue is full (the queue drains at the engine's pace)


def rate_refusal(policy: KeyPolicy, wait_s: float) -> ServiceError:
    return ServiceError(Code.RESOURCE_EXHAUSTED,
                        f"rate: key '{policy.name}' may send {policy.rate:g} requests/s, {policy.burst} at once "
                        f"(rate and burst in the keys file); retry after {wait_s:.2f} s", retry_after_s=wait_s)


def share_refusal(policy: KeyPolicy, unfinished: int, limit: int, max_queue: int) -> ServiceError:
    return ServiceError(Code.RESOURCE_EXHAUSTED,
                        f"queue_share: key '{policy.name}' has {unfinished} unfinished requests, its share of the "
                        f"queue is {limit} (queue_share {policy.queue_share:g} of max_queue {max_queue})",
                        retry_after_s=QUEUE_RETRY_S)


def gcra(tat: float, now: float, rate: float, burst: int) -> tuple[bool, float, float]:
    """One GCRA decision -> (accepted, new tat, seconds to wait when refused)."""
    interval = 1.0 / rate
    start = max(tat, now)
    wait = start - now - (burst - 1) * interval
    if wait > 1e-9:
        return False, tat, wait
    return True, start + interval, 0.0


class KeyQuotas:
    """In-process rate limits and queue shares per key name (not thread-safe: one event loop)."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._tat: dict[str, float] = {}
        self._unfinished: dict[str, int] = defaultdict(int)

    def admit(self, policy: KeyPolicy, max_queue: int) -> None:
        """Take a slot for one request of `policy`'s key, or raise RESOURCE_EXHAUSTED (nothing taken)."""
        if not policy.limited:
            return
        limit = policy.queue_limit(max_queue)
        unfinished = self._unfinished[policy.name]
        if limit is not None and unfinished >= limit:
            raise share_refusal(policy, unfinished, limit, max_queue)
        if policy.rate is not None:
            now = self.clock()
            accepted, tat, wait = gcra(self._tat.get(policy.name, now), now, policy.rate, policy.burst)
            if not accepted:
                raise rate_refusal(policy, wait)
            self._tat[policy.name] = tat
        self._unfinished[policy.name] += 1

    def release(self, policy: KeyPolicy) -> None:
        """The request admitted for `policy` is finished (answered, failed or abandoned)."""
        if policy.limited and self._unfinished[policy.name] > 0:
            self._unfinished[policy.name] -= 1

    def unfinished(self, name: str) -> int:
        return self._unfinished.get(name, 0)


def retry_after_header(seconds: float) -> str:
    """The HTTP Retry-After value: whole seconds, rounded up, at least 1."""
    return str(max(1, math.ceil(seconds)))
