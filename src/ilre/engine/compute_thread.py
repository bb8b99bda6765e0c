"""The one thread an engine computes on.

torch's CPU kernels run on OpenMP, whose thread teams belong to the thread that opens a parallel region: every
thread that runs a torch kernel gets a team of its own. Two live teams on the same cores (a model loaded on the
main thread and run on a queue's thread; deepening on a thread of its own) make each parallel region wait on the
other team's threads: measured on 2 cores, prefill 25-40% slower from the moment a second thread has run one
kernel. So an engine loads, answers and deepens on one thread; callers on other threads hand it the work.

glibc's malloc gives a second thread that allocates an arena of its own, and what the compute thread frees there
(prefill chunks, a tokenizer's pieces handed over from the caller's thread) is kept rather than trimmed: measured
at 130K tokens, 23 MiB more peak memory beyond the engine than with the work on the main thread (168 against 145).
The process keeps one arena (M_ARENA_MAX = 1; MALLOC_ARENA_MAX in the environment still decides), and the peak is
the main thread's again. Large blocks, torch's tensors, are taken under the one lock a few times per kernel.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")
M_ARENA_MAX = -8  # mallopt's parameter (glibc malloc.h)


def one_malloc_arena() -> bool:
    """Keep glibc malloc to one arena for the threads started from now on, unless MALLOC_ARENA_MAX is set; False
    where the C library is not glibc."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_ARENA_MAX, 1))
    except (OSError, AttributeError):
        return False


class ComputeThread:
    """A single worker thread; `call(fn, ...)` runs fn there and returns its result (directly when already
    on it, so that engine calls nest)."""

    def __init__(self, name: str = "ilre-engine"):
        one_malloc_arena()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self.ident = self._pool.submit(threading.get_ident).result()

    def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        if threading.get_ident() == self.ident:
            return fn(*args, **kwargs)
        return self._pool.submit(fn, *args, **kwargs).result()

    def close(self) -> None:
        """Let the thread end once its work is done (a call after this raises RuntimeError)."""
        self._pool.shutdown(wait=False)
