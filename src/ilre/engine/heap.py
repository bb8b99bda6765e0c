"""Giving freed memory back to the system.

glibc keeps what a process frees for reuse. A long-running engine frees tensors of every size (chunks,
candidates, cached documents evicted at the cap), and once glibc has raised its mmap threshold past them they
come from the heap, where a freed block below one still in use is never returned: the process holds the peak
of its fragments. Measured on a worker under an hour of several keys' traffic (bench/soak_mixed.py): its RSS
grew ~40 MiB a minute past its 1 GiB document cache, and one malloc_trim(0) gave back 1.2 GiB of 3.7.
`HeapTrimmer.after_work()` calls malloc_trim(0) at most once per interval; elsewhere (no glibc) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
from typing import Callable

TRIM_INTERVAL_S = 10.0  # at most one trim per this many seconds (returning 500 MiB took 80 ms, measured)


def _malloc_trim() -> Callable[[int], int] | None:
    """libc's malloc_trim, or None where the C library has none (musl, macOS, Windows)."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


class HeapTrimmer:
    """Returns the heap's free pages to the system after work, at most once per `interval_s` (0: every time).
    `trims` and `seconds` count what it did."""

    def __init__(self, interval_s: float = TRIM_INTERVAL_S):
        self.interval_s = interval_s
        self.trims, self.seconds = 0, 0.0
        self._trim = _malloc_trim()
        self._last = time.monotonic()
        self._lock = threading.Lock()

    @property
    def available(self) -> bool:
        return self._trim is not None

    def after_work(self) -> bool:
        """Trim now if the interval has passed since the last trim; True when it did."""
        if self._trim is None:
            return False
        with self._lock:
            now = time.monotonic()
            if now - self._last < self.interval_s:
                return False
            self._last = now
            clock = time.perf_counter()
            self._trim(0)
            self.trims += 1
            self.seconds += time.perf_counter() - clock
        return True
