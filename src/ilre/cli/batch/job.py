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
import gzip
import itertools
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from tqdm import tqdm

from ...service.common.errors import ServiceError
from ..output import CliError
from .backends import RETRIED, Backend
from .files import (STATE_SUFFIX, STDIO, InputDigest, JobState, LineFile, is_gz, legacy_lines, numbered_lines,
                    open_input, open_output, remove, tail_lines)
from .formats import LineRules, Outcome, compress_line, failed_line, line_key, record_key


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
    max_line_bytes: int = 64 << 20  # a longer input line is read past and becomes its error line


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


LINE_TRIES = 3  # a line failing for its own reason (the service up, its answer an error) this often: its error line


def run_job(job: BatchJob, backend: Backend) -> int:
    """Run `job` on `backend`; 0 when every line is done (bad lines are reported in their place), 130 when
    interrupted (the same command goes on); CliError when the run cannot proceed."""
    if job.restart:
        for path in (job.output, job.errors, job.output + STATE_SUFFIX):
            remove(path)
    lines = numbered_lines(open_input(job.input), job.input, job.max_line_bytes)
    digest = InputDigest()
    state = _resume(job, lines, digest) if job.output != STDIO else JobState()
    tally = Tally(before=state.lines)
    first = next(lines, None)
    if first is None and state.lines:
        print(f"ilre batch: {job.output} already holds all {state.lines} lines of {job.input}: nothing to do "
              f"(--restart runs them again)", file=sys.stderr)
        return 0
    lines = itertools.chain([first] if first is not None else [], lines)
    out = open_output(job.output, *state.files["output"])
    errors = open_output(job.errors, *state.files["errors"])
    done = _Progress(job, state, digest, out, errors)
    run_state, code = "finished", 0
    try:
        asyncio.run(_run(job, backend, lines, done, tally))
    except (KeyboardInterrupt, Interrupted):
        run_state, code = "interrupted", 130
    except ServiceError as exc:
        run_state = "failed"
        raise CliError(f"service: {exc.code.value}: {exc.message}; {tally.before + tally.lines} lines done, the same "
                       f"command goes on from there") from None
    finally:
        out.close()
        errors.close()
        if not errors.count:  # no line failed: no error file (as a batch API names none)
            remove(job.errors)
        if run_state != "failed":
            _report(job, tally, backend.retries, run_state)
    return code


class _Progress:
    """Each finished line written to its file, then the job's state beside the output (files.JobState)."""

    def __init__(self, job: BatchJob, state: JobState, digest: InputDigest, out: LineFile, errors: LineFile):
        self.job, self.state, self.digest, self.out, self.errors = job, state, digest, out, errors

    def write(self, raw: bytes | int, outcome: Outcome) -> None:
        (self.errors if outcome.to_errors else self.out).write(outcome.record)
        if self.job.output == STDIO:
            return
        self.digest.add(raw)
        self.state.lines += 1
        self.state.digest = self.digest.hexdigest()
        self.state.files = {"output": [self.out.count, self.out.size], "errors": [self.errors.count, self.errors.size]}
        self.state.write(self.job.output)


def _resume(job: BatchJob, lines: Iterator[tuple[int, bytes | int]], digest: InputDigest) -> JobState:
    """Where an earlier run of this job stopped, `lines` read past the input lines it finished (each checked to be
    this input's: the state's digest of them, and for a line written after the state, its key): the state."""
    state = JobState.read(job.output)
    if state is None:
        return _resume_unstated(job, lines, digest)
    tails = {name: tail_lines(path, state.files[name][1]) for name, path in (("output", job.output),
                                                                            ("errors", job.errors))}
    for _ in range(state.lines):
        line = next(lines, None)
        if line is None:
            break
        digest.add(line[1])
    if digest.hexdigest() != state.digest:
        raise CliError(f"output: {job.output} does not continue {job.input}: its {state.lines} finished lines were "
                       f"made from other input lines (--restart starts over)")
    outs = collections.deque(record_key(json.loads(line)) for line in tails["output"][0])
    errs = collections.deque(record_key(json.loads(line)) for line in tails["errors"][0])
    _match(lines, outs, errs, job, digest)  # the line or two written after the state
    for name, (tail, end) in tails.items():
        state.files[name] = [state.files[name][0] + len(tail), end]
    state.lines += len(tails["output"][0]) + len(tails["errors"][0])
    state.digest = digest.hexdigest()
    return state


def _resume_unstated(job: BatchJob, lines: Iterator[tuple[int, bytes | int]], digest: InputDigest) -> JobState:
    """An output with no state beside it (an older job's): taken on where each finished line names its input line's
    key, read in step with the input (memory flat); a `.gz` one is written again one member a line."""
    state = JobState()
    found = {name: _Peek(legacy_lines(path)) for name, path in (("output", job.output), ("errors", job.errors))}
    while any(side.head is not None for side in found.values()):
        keys = {name: record_key(json.loads(side.head)) if side.head is not None else _NONE
                for name, side in found.items()}
        if None in keys.values():
            raise CliError(f"output: {job.output} has no job state beside it and its lines name no id: it cannot be "
                           f"told to continue {job.input} (--restart starts over)")
        found[_next_finished(lines, keys["output"], keys["errors"], job, digest)].take()
        state.lines += 1
    for name, path in (("output", job.output), ("errors", job.errors)):
        count, size = found[name].count, found[name].size
        if count and is_gz(path):  # one gzip stream: written again a member per line, so a torn one can be cut
            with open(path + ".part", "wb") as again:
                for line in legacy_lines(path):
                    again.write(gzip.compress(line + b"\n", mtime=0))
                size = again.tell()
            os.replace(path + ".part", path)
        state.files[name] = [count, size]
    state.digest = digest.hexdigest()
    return state


class _Peek:
    """An output's finished lines one at a time: `head`, and what was taken (`count`, `size` in bytes)."""

    def __init__(self, lines: Iterator[bytes]):
        self._lines, self.count, self.size = lines, 0, 0
        self.head = next(self._lines, None)

    def take(self) -> None:
        self.count += 1
        self.size += len(self.head) + 1
        self.head = next(self._lines, None)


def _match(lines: Iterator[tuple[int, bytes | int]], outs: collections.deque, errs: collections.deque, job: BatchJob,
           digest: InputDigest) -> None:
    """Read past the input lines whose finished lines are `outs` and `errs` (their keys, in order, the output's and
    the error file's taken together), checking each key against its input line's."""
    while outs or errs:
        side = _next_finished(lines, outs[0] if outs else _NONE, errs[0] if errs else _NONE, job, digest)
        (outs if side == "output" else errs).popleft()


_NONE = object()  # no finished line left in that file


def _next_finished(lines: Iterator[tuple[int, bytes | int]], out_key, err_key, job: BatchJob,
                   digest: InputDigest) -> str:
    """The next input line read past: which file holds its finished line ("output" or "errors"), by the keys of
    their next lines; CliError where neither names it."""
    line = next(lines, None)
    if line is None:
        raise CliError(f"output: {job.output} holds more lines than {job.input} has: not this input's results "
                       f"(--restart starts over)")
    number, raw = line
    key = line_key(raw) if isinstance(raw, bytes) else None
    if err_key == key and out_key != key:
        side = "errors"
    elif out_key == key:
        side = "output"
    else:
        found = out_key if out_key is not _NONE else err_key
        raise CliError(f"output: {job.output} does not continue {job.input}: its next finished line is "
                       f"{found!r}, the input's line {number} is {key!r} (--restart starts over)")
    digest.add(raw)
    return side


async def _run(job: BatchJob, backend: Backend, lines: Iterator[tuple[int, bytes | int]], done: _Progress,
               tally: Tally) -> None:
    await backend.start()
    pending: collections.deque[tuple[bytes | int, asyncio.Task]] = collections.deque()
    progress = tqdm(initial=tally.before, unit="line", desc="ilre batch", file=sys.stderr, disable=None,
                    dynamic_ncols=True)

    def write(raw: bytes | int, outcome: Outcome) -> None:
        done.write(raw, outcome)
        tally.add(outcome)
        progress.update(1)
        seconds = max(time.perf_counter() - tally.started, 1e-9)
        progress.set_postfix_str(f"{tally.tokens_in / seconds:,.0f} tok/s, {tally.errors} errors", refresh=False)

    loop, stop = asyncio.get_running_loop(), asyncio.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:  # not the loop's own cancelling: a request that rides out a cancel would swallow it
        loop.add_signal_handler(sig, stop.set)
    reader = _LineReader(lines, loop, job.in_flight)

    async def unless_stopped(awaitable):
        """`awaitable`'s result, or Interrupted as soon as a signal came."""
        work, stopped = asyncio.ensure_future(awaitable), asyncio.ensure_future(stop.wait())
        await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if stop.is_set():
            work.cancel()
            raise Interrupted
        return work.result()

    async def first_write():
        raw, task = pending.popleft()
        write(raw, await unless_stopped(task))

    next_line = asyncio.ensure_future(reader.next())  # standard input may block: read on a thread of its own
    try:
        while True:  # a finished line is written while the next input line is awaited
            waiting = {next_line, *([pending[0][1]] if pending else [])}
            await unless_stopped(asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED))
            while pending and pending[0][1].done():
                await first_write()
            if not next_line.done():
                continue
            line = next_line.result()
            if line is None:
                break
            number, raw = line
            pending.append((raw, asyncio.create_task(_line(raw, number, job, backend))))
            while len(pending) >= job.in_flight:
                await first_write()
            next_line = asyncio.ensure_future(reader.next())
        while pending:
            await first_write()
    finally:
        next_line.cancel()
        for sig in signals:
            loop.remove_signal_handler(sig)
        for _, task in pending:
            task.cancel()
        progress.close()
        await backend.close()


async def _line(raw: bytes | int, number: int, job: BatchJob, backend: Backend) -> Outcome:
    """Line `number` compressed (formats.compress_line); over the byte cap, or failing LINE_TRIES times for its own
    reason (the service answering, with an error that is not the line's input), its error line."""
    if isinstance(raw, int):
        return failed_line(raw, number, f"{raw} bytes exceed the limit of {job.max_line_bytes} a line may hold "
                           "(--max-line-bytes)", job.rules)
    for attempt in range(1, LINE_TRIES + 1):
        try:
            return await compress_line(raw, number, job.rules, backend.line_runner())
        except ServiceError as exc:
            if exc.code in RETRIED:  # the service is gone past the retries: the run stops, the line not done
                raise
            if attempt == LINE_TRIES:
                return failed_line(raw, number, f"failed {LINE_TRIES} times: {exc.code.value}: {exc.message}",
                                   job.rules)
    raise AssertionError("unreachable")


class _LineReader:
    """The input's lines read on a daemon thread of their own (standard input may block: Ctrl-C must not wait for
    it), at most `ahead` of them waiting."""

    def __init__(self, lines: Iterator, loop: asyncio.AbstractEventLoop, ahead: int):
        self.queue: asyncio.Queue = asyncio.Queue()
        self._room = threading.Semaphore(max(1, ahead))
        self._loop = loop

        def read() -> None:
            try:
                for line in lines:
                    self._room.acquire()
                    loop.call_soon_threadsafe(self.queue.put_nowait, line)
                loop.call_soon_threadsafe(self.queue.put_nowait, None)
            except BaseException as exc:  # a read error (CliError): raised on the loop
                loop.call_soon_threadsafe(self.queue.put_nowait, exc)

        threading.Thread(target=read, daemon=True, name="ilre-batch-input").start()

    async def next(self):
        line = await self.queue.get()
        if isinstance(line, BaseException):
            raise line
        if line is not None:
            self._room.release()
        return line


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
