"""Giving freed memory back to the system.

A long-running engine allocates tensors of every size, a request's transient ones among the document cache's
long-lived ones, and frees them in any order. glibc keeps what a process frees for reuse; once it has raised
its mmap threshold past such blocks they come from the heap, where a freed block below one in use is never
returned, so the process comes to hold the peak of its fragments. Measured on a worker under an hour of several
keys' traffic (bench/soak_mixed.py): its RSS grew ~40 MiB a minute past its 1 GiB document cache, and one
malloc_trim(0) gave back 1.2 GiB of 3.7. Three things keep it down:

- `HeapTrimmer.after_work()`: malloc_trim(0) after requests, at most once per interval (returning 500 MiB
  took 80 ms);
- `off_heap`: what the document cache keeps lives in an anonymous mapping of its own, unmapped the moment the
  tensor is freed, so eviction returns it whatever the heap around it holds;
- `tune_allocator`: blocks over 32 MiB (glibc's largest threshold) get mappings of their own as well (a fixed
  mmap threshold), and glibc leaves trimming to the trimmer (a high trim threshold: freeing at the heap's top
  does not shrink it only for the next request to fault it in again). Below it, the chunk-sized blocks a prefill
  frees and takes again at every layer (a 1,024-token chunk's MLP product: 12 MiB in float32) are reused from
  the heap; with their own mappings (the threshold was 4 MiB) they were faulted in at each allocation
  (docs/benchmarks.md; bench/elementwise_bench.py). The server commands and `ilre batch` set it when they load
  their engine; a process that embeds the Engine as a library, or runs one command and exits, keeps glibc's
  defaults.

Where the C library has no malloc_trim or mallopt (musl, macOS, Windows), the trimmer and the tuning do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import os
import threading
import time
from typing import Callable

import torch

OFF_HEAP_MIN_BYTES = 128 << 10  # smaller tensors stay on the heap (glibc's own first mmap threshold)
MMAP_THRESHOLD = 32 << 20  # tune_allocator: larger blocks get a mapping of their own (glibc's maximum)
TRIM_THRESHOLD = 256 << 20  # tune_allocator: glibc shrinks the heap by itself only past this much free at its top
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
TRIM_INTERVAL_S = 10.0  # at most one trim per this many seconds (returning 500 MiB took 80 ms, measured)


def _malloc_trim() -> Callable[[int], int] | None:
    """libc's malloc_trim, or None where the C library has none (musl, macOS, Windows)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, loaded once (None where it cannot be found)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


@functools.cache
def tune_allocator() -> bool:
    """Set glibc's mmap and trim thresholds for a long-running engine, once per process (True when they were
    set): not where libc has no mallopt, nor where the operator set them (MALLOC_MMAP_THRESHOLD_,
    MALLOC_TRIM_THRESHOLD_ or GLIBC_TUNABLES in the environment)."""
    if any(name in os.environ for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")):
        return False
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


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

    def after_work(self, force: bool = False) -> bool:
        """Trim now if the interval has passed since the last trim (or `force`: whatever the interval, e.g. after
        a model load freed its plain weights); True when it did."""
        if self._trim is None:
            return False
        with self._lock:
            now = time.monotonic()
            if now - self._last < self.interval_s and not force:
                return False
            self._last = now
            clock = time.perf_counter()
            self._trim(0)
            self.trims += 1
            self.seconds += time.perf_counter() - clock
        return True


def off_heap(tensor: torch.Tensor, min_bytes: int = OFF_HEAP_MIN_BYTES) -> torch.Tensor:
    """The same values, contiguous, in an anonymous memory mapping of their own that is returned to the system
    when the tensor is freed; `tensor` itself when it is smaller than `min_bytes` or not in CPU memory."""
    if tensor.device.type != "cpu" or tensor.numel() * tensor.element_size() < min_bytes:
        return tensor
    pages = mmap.mmap(-1, tensor.numel() * tensor.element_size())
    moved = torch.frombuffer(pages, dtype=tensor.dtype, count=tensor.numel()).view(tensor.shape)
    return moved.copy_(tensor)
