"""The one thread an engine computes on.

torch's CPU kernels run on OpenMP, whose thread teams belong to the thread that opens a parallel region: every
thread that runs a torch kernel gets a team of its own. Two live teams on the same cores (a model loaded on the
main thread and run on a queue's thread; deepening on a thread of its own) make each parallel region wait on the
other team's threads: measured on 2 cores, prefill 25-40% slower from the moment a second thread has run one
kernel. So an engine loads, answers and deepens on one thread; callers on other threads hand it the work.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")


class ComputeThread:
    """A single worker thread; `call(fn, ...)` runs fn there and returns its result (directly when already
    on it, so that engine calls nest)."""

    def __init__(self, name: str = "ilre-engine"):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self.ident = self._pool.submit(threading.get_ident).result()

    def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        if threading.get_ident() == self.ident:
            return fn(*args, **kwargs)
        return self._pool.submit(fn, *args, **kwargs).result()

    def close(self) -> None:
        """Let the thread end once its work is done (a call after this raises RuntimeError)."""
        self._pool.shutdown(wait=False)
