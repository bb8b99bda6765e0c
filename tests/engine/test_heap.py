"""Freed memory goes back to the system (engine/heap.py): in a fresh process, blocks freed below one still in use
stay in glibc's heap until the trimmer runs; the engine runs it after requests."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ilre.engine.heap import HeapTrimmer
from ilre.engine.messages import CompressRequest

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
