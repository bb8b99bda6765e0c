"""One `ilre batch` run: the input's lines read as they go, at most `in_flight` of them compressed at once, each
written as soon as every line before it is (the output in input order), progress on the terminal, one summary line
at the end (and a JSON one with --json).

Run again after an interruption, the job reads what its files hold (files.py), checks that they continue this input
(each finished line's id or custom_id against the input line's), and goes on after the last finished line; a job
already finished says so and does nothing; `restart` starts over.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from tqdm import tqdm

from ...service.common.errors import ServiceError
from ..output import CliError
from .backends import Backend
from .files import STDIO, LineFile, complete_lines, count_lines, numbered_lines, open_input, open_output, remove
from .formats import LineRules, Outcome, compress_line, line_key, record_key


@dataclass
class BatchJob:
    """What to run: the input, the output and error files, how many lines at once, the line rules."""

    input: str
    output: str
    errors: str
    rules: LineRules = field(default_factory=LineRules)
    in_flight: int = 16
    restart: bool = False
    json_summary: bool = False


@dataclass
class Tally:
    """What this run did, for the progress bar and the summary."""

    before: int = 0  # lines finished by earlier runs
    lines: int = 0
    errors: int = 0
    passed: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    started: float = field(default_factory=time.perf_counter)

    def add(self, outcome: Outcome) -> None:
        self.lines += 1
        self.errors += outcome.error
        self.passed += outcome.passed
        self.tokens_in += outcome.tokens_in
        self.tokens_out += outcome.tokens_out

    def summary(self, job: BatchJob, retries: int, state: str) -> dict[str, Any]:
        seconds = time.perf_counter() - self.started
        return {"state": state, "lines": self.lines, "done_before": self.before, "compressed": self.lines - self.errors,
                "errors": self.errors, "passed_through": self.passed, "tokens_in": self.tokens_in,
                "tokens_out": self.tokens_out, "seconds": round(seconds, 3),
                "lines_per_s": round(self.lines / seconds, 3) if seconds else 0.0,
                "tokens_per_s": round(self.tokens_in / seconds, 1) if seconds else 0.0, "retries": retries,
                "output": job.output, "errors_file": job.errors if os.path.exists(job.errors) else None}


class Interrupted(Exception):
    """SIGINT or SIGTERM: the job stops after the lines already written (none is cut)."""


def run_job(job: BatchJob, backend: Backend) -> int:
    """Run `job` on `backend`; 0 when every line is done (bad lines are reported in their place), 130 when
    interrupted (the same command goes on); CliError when the run cannot proceed."""
    if job.restart:
        remove(job.output)
        remove(job.errors)
    resumable = job.output != STDIO
    kept, kept_size = complete_lines(job.output) if resumable else ([], 0)
    failed, failed_size = complete_lines(job.errors) if resumable else ([], 0)
    tally = Tally(before=len(kept) + len(failed))
    total = count_lines(job.input)
    stream = open_input(job.input)
    lines = numbered_lines(stream, job.input)
    _skip_done(lines, kept, failed, job)
    if total is not None and tally.before >= total and tally.before:
        print(f"ilre batch: {job.output} already holds all {total} lines of {job.input}: nothing to do "
              f"(--restart runs them again)", file=sys.stderr)
        return 0
    out, errors = open_output(job.output, kept, kept_size), open_output(job.errors, failed, failed_size)
    state, code = "finished", 0
    try:
        asyncio.run(_run(job, backend, lines, out, errors, tally, total))
    except (KeyboardInterrupt, Interrupted):
        state, code = "interrupted", 130
    except ServiceError as exc:
        state = "failed"
        raise CliError(f"service: {exc.code.value}: {exc.message}; {tally.before + tally.lines} lines done, the same "
                       f"command goes on from there") from None
    finally:
        out.close()
        errors.close()
        if not errors.count:  # no line failed: no error file (as a batch API names none)
            remove(job.errors)
        if state != "failed":
            _report(job, tally, backend.retries, state)
    return code


def _skip_done(lines: Iterator[tuple[int, bytes]], kept: list[bytes], failed: list[bytes], job: BatchJob) -> None:
    """Read past the input lines earlier runs finished, checking that the files continue this input: each finished
    line carries the key of its input line, in order (the output's and the error file's lines taken together)."""
    outs = collections.deque(record_key(json.loads(line)) for line in kept)
    errs = collections.deque(record_key(json.loads(line)) for line in failed)
    for _ in range(len(outs) + len(errs)):
        try:
            number, raw = next(lines)
        except StopIteration:
            raise CliError(f"output: {job.output} holds more lines than {job.input} has: not this input's results "
                           f"(--restart starts over)") from None
        key = line_key(raw)
        if errs and errs[0] == key and not (outs and outs[0] == key):
            errs.popleft()
        elif outs and outs[0] == key:
            outs.popleft()
        elif errs and errs[0] == key:
            errs.popleft()
        else:
            found = outs[0] if outs else errs[0]
            raise CliError(f"output: {job.output} does not continue {job.input}: its next finished line is "
                           f"{found!r}, the input's line {number} is {key!r} (--restart starts over)")


async def _run(job: BatchJob, backend: Backend, lines: Iterator[tuple[int, bytes]], out: LineFile,
               errors: LineFile, tally: Tally, total: int | None) -> None:
    await backend.start()
    pending: collections.deque[asyncio.Task] = collections.deque()
    progress = tqdm(total=total, initial=tally.before, unit="line", desc="ilre batch", file=sys.stderr, disable=None,
                    dynamic_ncols=True)

    def write(outcome: Outcome) -> None:
        (errors if outcome.to_errors else out).write(outcome.record)
        tally.add(outcome)
        progress.update(1)
        seconds = max(time.perf_counter() - tally.started, 1e-9)
        progress.set_postfix_str(f"{tally.tokens_in / seconds:,.0f} tok/s, {tally.errors} errors", refresh=False)

    loop, stop = asyncio.get_running_loop(), asyncio.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:  # not the loop's own cancelling: a request that rides out a cancel would swallow it
        loop.add_signal_handler(sig, stop.set)

    async def unless_stopped(awaitable):
        """`awaitable`'s result, or Interrupted as soon as a signal came."""
        work, stopped = asyncio.ensure_future(awaitable), asyncio.ensure_future(stop.wait())
        await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if stop.is_set():
            work.cancel()
            raise Interrupted
        return work.result()

    try:
        while True:
            line = await unless_stopped(asyncio.to_thread(next, lines, None))  # standard input may block: off the loop
            if line is None:
                break
            number, raw = line
            pending.append(asyncio.create_task(compress_line(raw, number, job.rules, backend.run)))
            while len(pending) >= job.in_flight or (pending and pending[0].done()):
                write(await unless_stopped(pending.popleft()))
        while pending:
            write(await unless_stopped(pending.popleft()))
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        for task in pending:
            task.cancel()
        progress.close()
        await backend.close()


def _report(job: BatchJob, tally: Tally, retries: int, state: str) -> None:
    """One summary line on standard error; with --json the summary as JSON too (on standard output, or on standard
    error when the results go there)."""
    s = tally.summary(job, retries, state)
    went = f" -> {job.output}" + (f", errors -> {job.errors}" if tally.errors - tally.passed else "")
    resumed = f", after {tally.before} done before" if tally.before else ""
    print(f"ilre batch: {state}: {s['lines']} lines in {s['seconds']:.1f} s ({s['lines_per_s']:.2f} lines/s{resumed}), "
          f"{s['compressed']} compressed, {s['errors']} failed ({s['passed_through']} passed through unchanged); "
          f"{s['tokens_in']:,} -> {s['tokens_out']:,} context tokens ({s['tokens_per_s']:,.0f} tokens/s in){went}",
          file=sys.stderr)
    if job.json_summary:
        print(json.dumps(s), file=sys.stderr if job.output == STDIO else sys.stdout, flush=True)
