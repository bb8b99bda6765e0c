"""Deepening: documents encoded in full to l_R in the engine's idle moments, so later queries are cheap.

A first query of a long document runs the cascade (compressor/strategies/cascade.py): the streaming prefill to the
coarse layer over the whole document, then the candidates again to l_R. Its candidates depend on the
query, so a later query pays the candidate pass again. Once a document has been asked, the engine offers
it here; a background thread runs the streaming prefill to l_R over the whole document (keeping the
coarse layer's keys too), one layer of one chunk at a time, only while no request wants the model, and
hands the finished state to the document cache. Later queries of the document then run the strategy's
`deepened()` form against it: a query chunk and a score over every token, with no candidate pass.

Requests come first: each takes its turn through `turn()`, which a step in progress delays by at most one
layer of one chunk; no step starts while a request waits. Owners (the callers' scopes) take turns, round
robin, newest offer first within an owner; an owner that had nothing waiting goes next, so a key that floods
the queue delays another key's document by at most the document being deepened. At most `max_pending` wait per owner (its oldest
is dropped beyond), and MAX_WAITING in all (the oldest offer of the owner with the most is dropped). A
document that left the cache is skipped.
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

from ..compressor.context_state import ContextState

log = logging.getLogger(__name__)

MAX_PENDING = 8  # documents of one owner waiting to be deepened; its oldest offer is dropped beyond this
MAX_WAITING = 64  # documents of all owners waiting

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

    def __init__(self, enabled: bool, run_on: Callable[..., object] | None = None, max_pending: int = MAX_PENDING):
        """`run_on(fn)`: runs each step where the engine computes (engine/compute_thread.py); None: on the
        deepening thread itself."""
        self.enabled = enabled
        self._run_on = run_on or (lambda fn, *args: fn(*args))
        self.max_pending = max_pending
        self.stats = DeepeningStats()
        self._model = threading.Lock()  # who runs on the model now: one request, or one deepening step
        self._changed = threading.Condition()
        self._waiting = 0  # requests that want the model
        self._offers: dict[str, collections.OrderedDict[str, _Offer]] = {}  # owner -> its offers, newest first
        self._turns: collections.deque[str] = collections.deque()  # owners with offers, the next one first
        self._busy = False  # a document is being deepened
        self._closed = False
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Hold the model for one request: waits for a deepening step in progress, and no new step starts
        until every waiting request has had its turn."""
        with self.paused(), self._model:
            yield

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No deepening step starts while held (requests run as usual): as if a request were always waiting."""
        with self._changed:
            self._waiting += 1
        try:
            yield
        finally:
            with self._changed:
                self._waiting -= 1
                self._changed.notify_all()

    def offer(self, name: str, start: Callable[[], Generator[None, None, ContextState]],
              store: Callable[[ContextState], None], wanted: Callable[[], bool], owner: str = "") -> None:
        """Queue document `name` (a cache slot and state key) of `owner` (the caller's scope tag) for deepening,
        first among its owner's; a name already queued moves to the front."""
        if not self.enabled or self._closed:
            return
        with self._changed:
            for offers in self._offers.values():
                offers.pop(name, None)
            if owner not in self._offers or not self._offers[owner]:
                self._offers[owner] = collections.OrderedDict()
                if owner not in self._turns:  # an owner that had nothing waiting goes next
                    self._turns.appendleft(owner)
            offers = self._offers[owner]
            offers[name] = _Offer(start, store, wanted)
            offers.move_to_end(name, last=False)
            while len(offers) > self.max_pending:
                offers.popitem()
                self.stats.dropped += 1
            while sum(len(o) for o in self._offers.values()) > MAX_WAITING:
                max(self._offers.values(), key=len).popitem()
                self.stats.dropped += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ilre-deepening", daemon=True)
                self._thread.start()
                _RUNNING.add(self)
            self._changed.notify_all()

    def pending(self, name: str) -> bool:
        """Whether document `name` waits to be deepened."""
        with self._changed:
            return any(name in offers for offers in self._offers.values())

    def _waiting_offers(self) -> bool:
        return any(self._offers.values())

    def _next(self) -> _Offer:
        """The newest offer of the next owner in turn (the caller holds the lock and knows there is one)."""
        while not self._offers.get(self._turns[0]):
            self._offers.pop(self._turns.popleft(), None)
        owner = self._turns.popleft()
        _, offer = self._offers[owner].popitem(last=False)
        if self._offers[owner]:
            self._turns.append(owner)
        else:
            del self._offers[owner]
        return offer

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until nothing is queued or being deepened (True), or `timeout` seconds pass (False)."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._waiting_offers() and not self._busy, timeout)

    def close(self) -> None:
        """Stop after the step in progress; queued documents are dropped (also done at exit)."""
        with self._changed:
            self._closed = True
            self._offers.clear()
            self._turns.clear()
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._closed or self._waiting_offers())
                if self._closed:
                    return
                offer = self._next()
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
        steps: list[Generator[None, None, ContextState]] = []
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._closed or not self._waiting)
                if self._closed:
                    return
            if self._run_on(self._step, offer, steps):
                return

    def _step(self, offer: _Offer, steps: list[Generator[None, None, ContextState]]) -> bool:
        """One step of `offer`'s encoding (its generator kept in `steps`); True when the document is done with."""
        with self._model, torch.inference_mode():
            clock = time.perf_counter()
            try:
                if not steps:
                    if not offer.wanted():
                        self.stats.dropped += 1
                        return True
                    steps.append(offer.start())
                next(steps[0])
                return False
            except StopIteration as done:
                offer.store(done.value)
                self.stats.finished += 1
                return True
            finally:
                self.stats.steps += 1
                self.stats.seconds += time.perf_counter() - clock
