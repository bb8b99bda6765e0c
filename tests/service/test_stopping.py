"""A stop never hangs on a background task: one whose clean-up awaits something that never comes ends at the next
cancel; one that refuses every cancel is left behind after its tries, and the stop goes on."""

from __future__ import annotations

import asyncio
import time

from ilre.service.common.stopping import cancel_until_done


async def _clean_up_that_waits_forever(started: asyncio.Event) -> None:
    try:
        started.set()
        await asyncio.sleep(3600)
    finally:
        await asyncio.Event().wait()  # a pool waiting on itself: only a second cancel ends this


class _RefusesEveryCancel:
    """A task body that swallows every cancel until `released`."""

    released = False

    async def __call__(self, started: asyncio.Event) -> None:
        started.set()
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if self.released:
                    raise


async def _stop(body) -> tuple[bool, float, asyncio.Task]:
    started = asyncio.Event()
    task = asyncio.create_task(body(started))
    await started.wait()
    start = time.monotonic()
    ended = await cancel_until_done(task, step_s=0.2, tries=3)
    return ended, time.monotonic() - start, task


def test_a_task_stuck_in_its_clean_up_ends_at_the_second_cancel():
    async def main():
        one_cancel = asyncio.create_task(_clean_up_that_waits_forever(asyncio.Event()))
        await asyncio.sleep(0)
        one_cancel.cancel()
        done, _ = await asyncio.wait({one_cancel}, timeout=0.3)
        assert not done  # what a single cancel and a wait (the old stop) leaves hanging
        ended, seconds, task = await _stop(_clean_up_that_waits_forever)
        one_cancel.cancel()
        await asyncio.wait({one_cancel}, timeout=1)
        return ended, seconds, task

    ended, seconds, task = asyncio.run(main())
    assert ended and task.cancelled() and 0.2 <= seconds < 0.6  # one wait of 0.2 s, then the second cancel


def test_a_task_refusing_every_cancel_is_left_after_its_tries():
    body = _RefusesEveryCancel()

    async def main():
        ended, seconds, task = await _stop(body)
        alive = not task.done()
        body.released = True  # measured: now let it end
        task.cancel()
        await asyncio.wait({task}, timeout=1)
        return ended, seconds, alive

    ended, seconds, alive = asyncio.run(main())
    assert not ended and alive and 0.6 <= seconds < 1.5  # three cancels of 0.2 s each, then the stop goes on


def test_a_task_given_grace_ends_on_its_own_uncancelled():
    async def main():
        task = asyncio.create_task(asyncio.sleep(0.1, result="closed"))
        ended = await cancel_until_done(task, step_s=0.2, tries=1, grace_s=1.0)
        return ended, task

    ended, task = asyncio.run(main())
    assert ended and not task.cancelled() and task.result() == "closed"
