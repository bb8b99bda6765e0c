"""Deepening: documents encoded in full to l_R in the engine's idle moments, so later queries are cheap.

A first query of a long document runs the cascade (compressor/strategies/cascade.py): the streaming prefill to the
coarse layer over the whole document, then the candidates again to l_R. Its candidates depend on the
query, so a later query pays the candidate pass again. Once a document has been asked, the engine offers
it here; a background thread runs the streaming prefill to l_R over the whole document (keeping the
coarse layer's keys too), one layer of one chunk at a time, only while no request wants the model, and
hands the finished state to the document cache. Later queries of the document then run the strategy's
`deepened()` form against it: a query chunk and a score over every token, with no candidate pass.

Requests come first: each takes its turn through `turn()`, which a step in progress delays by at most one
layer of one chunk; no step starts while a request waits. The newest offers run first; at most
`max_pending` wait, older ones are dropped. A document that left the cache is skipped.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Generator, Iterator

import torch

from ..compressor.prefill import ContextState

log = logging.getLogger(__name__)

MAX_PENDING = 8  # documents waiting to be deepened; the oldest offer is dropped beyond this

_RUNNING: "weakref.WeakSet[Deepener]" = weakref.WeakSet()  # closed at exit: a step must not outlive the interpreter


@atexit.register
def _close_all() -> None:
    for deepener in list(_RUNNING):
        deepener.close()


@dataclass
class _Offer:
    """A document to deepen: `start()` makes its stepwise encoding (compressor/prefill.encode_in_steps),
    `store(state)` hands the result to the cache, `wanted()` says whether it is still worth doing."""

    start: Callable[[], Generator[None, None, ContextState]]
    store: Callable[[ContextState], None]
    wanted: Callable[[], bool]


@dataclass
class DeepeningStats:
    """Counters for /metrics and the bench: documents finished and dropped, steps run, seconds spent."""

    finished: int = 0
    dropped: int = 0
    steps: int = 0
    seconds: float = 0.0


class Deepener:
    """The engine's background deepening. `turn()` gives a request the model (the engine's one-at-a-time
    lock); `offer(name, ...)` queues a document; `wait_idle()` blocks until nothing is queued or running.
    With `enabled` False, offers are ignored and no thread is started."""

    def __init__(self, enabled: bool, max_pending: int = MAX_PENDING):
        self.enabled = enabled
        self.max_pending = max_pending
        self.stats = DeepeningStats()
        self._model = threading.Lock()  # who runs on the model now: one request, or one deepening step
        self._changed = threading.Condition()
        self._waiting = 0  # requests that want the model
        self._offers: collections.OrderedDict[str, _Offer] = collections.OrderedDict()
        self._busy = False  # a document is being deepened
        self._closed = False
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Hold the model for one request: waits for a deepening step in progress, and no new step starts
        until every waiting request has had its turn."""
        with self._changed:
            self._waiting += 1
        try:
            with self._model:
                yield
        finally:
            with self._changed:
                self._waiting -= 1
                self._changed.notify_all()

    def offer(self, name: str, start: Callable[[], Generator[None, None, ContextState]],
              store: Callable[[ContextState], None], wanted: Callable[[], bool]) -> None:
        """Queue document `name` (a cache slot and state key) for deepening, newest first; a name already
        queued moves to the front."""
        if not self.enabled or self._closed:
            return
        with self._changed:
            self._offers[name] = _Offer(start, store, wanted)
            self._offers.move_to_end(name, last=False)
            while len(self._offers) > self.max_pending:
                self._offers.popitem()
                self.stats.dropped += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ilre-deepening", daemon=True)
                self._thread.start()
                _RUNNING.add(self)
            self._changed.notify_all()

    def pending(self, name: str) -> bool:
        """Whether document `name` waits to be deepened."""
        with self._changed:
            return name in self._offers

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until nothing is queued or being deepened (True), or `timeout` seconds pass (False)."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._offers and not self._busy, timeout)

    def close(self) -> None:
        """Stop after the step in progress; queued documents are dropped (also done at exit)."""
        with self._changed:
            self._closed = True
            self._offers.clear()
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._closed or self._offers)
                if self._closed:
                    return
                _, offer = self._offers.popitem(last=False)
                self._busy = True
            try:
                self._deepen(offer)
            except Exception:  # a failed deepening costs later queries speed, never a request
                log.exception("deepening a document failed; its queries keep the first query's path")
                self.stats.dropped += 1
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()

    def _deepen(self, offer: _Offer) -> None:
        """Run one document's encoding a step at a time, each only while no request waits."""
        steps: Generator[None, None, ContextState] | None = None
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._closed or not self._waiting)
                if self._closed:
                    return
            with self._model, torch.inference_mode():
                clock = time.perf_counter()
                try:
                    if steps is None:
                        if not offer.wanted():
                            self.stats.dropped += 1
                            return
                        steps = offer.start()
                    next(steps)
                except StopIteration as done:
                    offer.store(done.value)
                    self.stats.finished += 1
                    return
                finally:
                    self.stats.steps += 1
                    self.stats.seconds += time.perf_counter() - clock
