"""Freed memory goes back to the system (engine/heap.py): in a fresh process, blocks freed below one still in use
stay in glibc's heap until the trimmer runs; the engine runs it after requests. What the document cache keeps
lives in mappings of its own, which go back the moment they are freed, trim or not."""

from __future__ import annotations

import gc
import mmap
import os
import subprocess
import sys

import pytest
import torch

from ilre.compressor.context_state import ContextState
from ilre.contract.messages import CompressRequest
from ilre.engine.heap import HeapTrimmer, OFF_HEAP_MIN_BYTES, _libc, off_heap

FRAGMENTED = """
import torch
from ilre.engine.heap import HeapTrimmer

def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

trimmer = HeapTrimmer(interval_s=0)
raised = torch.ones(16 << 20, dtype=torch.uint8)  # mmapped; freeing it raises glibc's mmap threshold to 16 MiB
del raised
blocks = [torch.ones(8 << 20, dtype=torch.uint8) for _ in range(64)]  # 512 MiB, now from the heap
top = blocks.pop()  # the last one stays: the heap cannot shrink from its end
del blocks
held = rss_mib()
assert trimmer.after_work() and trimmer.trims == 1
print(held, rss_mib(), top.numel())
"""


def test_freed_blocks_below_a_live_one_go_back_only_when_trimmed():
    if not HeapTrimmer().available:
        pytest.skip("no malloc_trim in this C library")
    out = subprocess.run([sys.executable, "-c", FRAGMENTED], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    held, after, _ = (float(x) for x in out.stdout.split())
    assert held - after > 400, (held, after)  # the 504 MiB freed below the live block were still held


OFF_HEAP = """
import torch
from ilre.engine.heap import off_heap

def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

raised = torch.ones(16 << 20, dtype=torch.uint8)  # as above: 8 MiB blocks would come from the heap
del raised
blocks = [off_heap(torch.ones(8 << 20, dtype=torch.uint8)) for _ in range(64)]  # 512 MiB, moved off it
top = torch.ones(8 << 20, dtype=torch.uint8)  # a live heap block after them
held = rss_mib()
del blocks  # and no trim
print(held, rss_mib(), top.numel())
"""


def test_blocks_moved_off_the_heap_go_back_when_freed_without_a_trim():
    out = subprocess.run([sys.executable, "-c", OFF_HEAP], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    held, after, _ = (float(x) for x in out.stdout.split())
    assert held - after > 400, (held, after)  # the 504 MiB went back at once


TUNED = """
import sys, torch
from ilre.engine.heap import tune_allocator

if sys.argv[1] == "tuned":
    assert tune_allocator()


def on_heap(tensor):
    line = next(line for line in open("/proc/self/maps") if line.rstrip().endswith("[heap]"))
    low, high = (int(end, 16) for end in line.split()[0].split("-"))
    return low <= tensor.data_ptr() < high, high


chunk = torch.ones(12 << 20, dtype=torch.uint8)  # a 1,024-token chunk's MLP product in float32
chunk_on_heap, top = on_heap(chunk)
del chunk
kept = on_heap(torch.ones(1, dtype=torch.uint8))[1] >= top  # its pages stay for the next chunk (until a trim)
print(chunk_on_heap, kept, on_heap(torch.ones(40 << 20, dtype=torch.uint8))[0])
"""


@pytest.mark.parametrize("mode, placed", [("default", "False True False"), ("tuned", "True True False")])
def test_a_tuned_allocator_reuses_chunk_sized_blocks_and_maps_bigger_ones(mode, placed):
    """Tuned, a chunk's 12 MiB block comes from the heap and stays there when freed (not faulted in again by the next
    layer); glibc's first threshold maps it. A block over 32 MiB gets a mapping of its own either way."""
    if getattr(_libc(), "mallopt", None) is None:
        pytest.skip("no mallopt in this C library")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", TUNED, mode], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == placed.split()


def own_mapping(tensor: torch.Tensor) -> bool:
    """Whether the tensor's storage is exactly one mapping of its own (as /proc/self/maps lists it)."""
    start, size = tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes()
    with open("/proc/self/maps") as maps:
        for line in maps:
            low, high = (int(x, 16) for x in line.split()[0].split("-"))
            if low <= start < high:
                return low == start and high - low == -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
    return False


def test_off_heap_keeps_the_values_and_leaves_small_tensors_where_they_are():
    big = torch.randn(3, 1000, 64).to(torch.bfloat16)[:, ::2]  # a strided view, in the model's dtype
    moved = off_heap(big)
    assert torch.equal(moved, big) and moved.is_contiguous() and own_mapping(moved) and not own_mapping(big)
    small = torch.ones(OFF_HEAP_MIN_BYTES // 4 - 1)
    assert off_heap(small) is small


def test_the_document_cache_keeps_a_state_and_its_ids_off_the_heap(engine):
    context = "The keeper of the lighthouse wrote the same line every night. " * 150
    first = engine.compress(CompressRequest(context=context, query="What did the keeper write?", budget=64))
    entry = engine.documents._docs[next(reversed(engine.documents._docs))]
    state = next(iter(entry.states.values()))
    big = [t for t in [*state.keys.values(), *(c.k for c in state.caches), *(c.v for c in state.caches)]
           if t.numel() * t.element_size() >= OFF_HEAP_MIN_BYTES]
    assert big and all(own_mapping(t) for t in big)
    assert entry.ids.numel() * 8 < OFF_HEAP_MIN_BYTES or own_mapping(entry.ids)
    again = engine.compress(CompressRequest(document_id=first.document_id, query="What did the keeper write?",
                                            budget=64))
    assert again.kept_indices == first.kept_indices  # read from the moved tensors


def test_the_interval_bounds_how_often_it_trims():
    trimmer = HeapTrimmer(interval_s=3600)
    assert not trimmer.after_work() and trimmer.trims == 0  # the interval counts from its start
    trimmer.interval_s = 0
    assert trimmer.after_work() == trimmer.available and trimmer.trims == int(trimmer.available)


def test_the_engine_trims_after_a_request(engine):
    before, interval = engine.heap.trims, engine.heap.interval_s
    engine.heap.interval_s = 0
    try:
        engine.compress(CompressRequest(context="The quick brown fox jumps over the lazy dog. " * 40,
                                        query="What jumps?", budget=32))
    finally:
        engine.heap.interval_s = interval
    assert engine.heap.trims == before + int(engine.heap.available)


def test_a_finished_request_leaves_no_tensor_to_the_cycle_collector(engine):
    """What a request made is freed when it ends, not when Python's cycle collector next comes round: a cycle
    through a request's encodings kept evicted document states alive in a worker past its cache's cap."""
    context = "The ferry leaves the north pier at nine and the south pier at ten. " * 120
    gc.collect()
    flags = gc.get_debug()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds unreachable is kept in gc.garbage, to be looked at
    try:
        engine.compress(CompressRequest(context=context, queries=["When does the ferry leave?", "Which pier?"],
                                        budget=64))
        gc.collect()
        left = [type(o).__name__ for o in gc.garbage if isinstance(o, (torch.Tensor, ContextState))]
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()
    assert left == []
