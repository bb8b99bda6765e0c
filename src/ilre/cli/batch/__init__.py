"""`ilre batch`: a corpus job. Lines are read and written as they go (`-` for standard input or output, `.gz` by the
name), in ilre's own format or as OpenAI batch requests (formats.py), compressed in process, on running services
(`--server`) or by the worker pool behind a Redis queue (`--redis-url`) with a bounded number in flight
(backends.py), the output in input order; the same command run again after any interruption goes on where it
stopped (job.py, files.py)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Callable

from .backends import Backend, LocalBackend, RedisBackend, ServerBackend
from .files import errors_path
from .formats import LineRules
from .job import BatchJob, run_job


def run_batch(args: argparse.Namespace, defaults: dict[str, Any], engine: Callable[[], Any]) -> int:
    """Run `ilre batch` as parsed: `defaults`, the request fields of the command line; `engine()` loads the model
    (only when the lines are compressed in this process)."""
    job = BatchJob(args.input, args.output, args.errors or errors_path(args.output),
                   LineRules({k: v for k, v in defaults.items() if v is not None}, args.pass_errors),
                   args.in_flight, args.restart, args.json, args.max_line_bytes)
    return run_job(job, _backend(args, engine))


def run_batch_file(engine: Any, source: Path, target: Path, defaults: dict[str, Any], in_flight: int = 16,
                   timeout_s: float = 300.0) -> int:
    """The library's call: `source`'s lines compressed by `engine` (in this process) into `target` (taken on where an
    earlier run stopped), as `ilre batch` does; its exit status."""
    job = BatchJob(str(source), str(target), errors_path(str(target)),
                   LineRules({k: v for k, v in defaults.items() if v is not None}), in_flight)
    return run_job(job, LocalBackend(engine, in_flight, timeout_s, retry_s=timeout_s))


def _backend(args: argparse.Namespace, engine: Callable[[], Any]) -> Backend:
    if args.server:
        return ServerBackend(args.server, args.api_key or os.environ.get("ILRE_API_KEY"), args.timeout, args.retry_s)
    if args.redis_url:
        return RedisBackend(args.redis_url, args.redis_prefix, args.in_flight, args.timeout, args.retry_s)
    return LocalBackend(engine(), args.in_flight, args.timeout, args.retry_s)
