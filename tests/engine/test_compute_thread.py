"""An engine computes on one thread whichever thread calls it (engine/compute_thread.py): its model was loaded
there, its requests and its deepening steps run there, and calls nest without a hop."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from ilre.contract.messages import CompressRequest
from ilre.engine.compute_thread import ComputeThread
from ilre.engine.deepening import Deepener

from .test_deepening import counting

def test_requests_from_any_thread_run_on_the_engines_thread(engine, monkeypatch):
    seen: list[int] = []
    answer = engine.answer

    def recorded(job):
        seen.append(threading.get_ident())
        return answer(job)

    monkeypatch.setattr(engine, "answer", recorded)
    request = CompressRequest(context="The sky is blue. " * 40 + "The code is 4417. " + "Grass is green. " * 40,
                              query="What is the code?", budget=32)
    here = engine.compress(request)
    with ThreadPoolExecutor(2) as pool:
        there = [f.result() for f in [pool.submit(engine.compress, request) for _ in range(2)]]
        many = pool.submit(engine.compress_many, [request]).result()
    assert len(seen) == 4 and set(seen) == {engine.thread.ident} != {threading.get_ident()}
    assert all(r.compressed_context == here.compressed_context for r in there)
    assert many[0].results[0].compressed_context == here.compressed_context
    assert "4417" in here.compressed_context

def test_calls_nest_and_deepening_steps_run_where_the_engine_computes():
    compute = ComputeThread("test-compute")
    assert compute.call(lambda: compute.call(threading.get_ident)) == compute.ident  # nested: no deadlock
    steps_on: list[int] = []

    def run_on(fn, *args):
        return compute.call(lambda: (steps_on.append(threading.get_ident()), fn(*args))[1])

    deepener, log, stored = Deepener(True, run_on), [], []
    try:
        deepener.offer("doc", counting(log, "doc", 3), stored.append, lambda: True)
        assert deepener.wait_idle(10)
    finally:
        deepener.close()
        compute.close()
    assert stored == ["doc"] and log == [("doc", 0), ("doc", 1), ("doc", 2)]
    assert set(steps_on) == {compute.ident} and len(steps_on) == 4  # three steps and the one that finishes
