"""Stopping background tasks without hanging the stop: a task cut off mid-request may await, in its clean-up,
something that never comes (a connection pool left waiting on itself); a second cancel ends that wait."""

from __future__ import annotations

import asyncio

STOP_STEP_S = 2.0  # how long a cancelled task gets to end before it is cancelled again
STOP_TRIES = 3  # cancels before a task is left behind


async def cancel_until_done(task: asyncio.Task, step_s: float = STOP_STEP_S, tries: int = STOP_TRIES,
                            grace_s: float = 0.0) -> bool:
    """Let `task` run on for `grace_s`, then cancel it and wait up to `step_s` for it to end, cancelling it again each
    time it has not; True when it ended (whatever its outcome), False when it outlived `tries` cancels (the caller
    logs it and goes on)."""
    if grace_s > 0 and (await asyncio.wait({task}, timeout=grace_s))[0]:
        return True
    for _ in range(tries):
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=step_s)
        if done:
            return True
    return False
