"""The batch job's files: the input read line by line as it goes (a path, `-` for standard input, `.gz` by its
name), and the output and error files written line by line, each line whole, in input order, so that the same
command run again after any interruption finds what is done and goes on after it.

What is done is read back from the files themselves: every complete line (ending in a newline and parsing as
JSON) is a finished input line; a torn last line (a kill during a write, a full disk) is cut off. A `.gz` output
is read back to its last complete line and written again before the job goes on (a torn gzip member cannot be
cut in place). Standard output is never read back: a job written there starts from the first line.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from ..output import CliError

STDIO = "-"


def _is_gz(path: str) -> bool:
    return path.endswith(".gz")


def open_input(path: str) -> BinaryIO:
    """The input as a binary stream (standard input for `-`, decompressed for `.gz`); CliError naming the path."""
    if path == STDIO:
        return sys.stdin.buffer
    try:
        raw = open(path, "rb")
    except OSError as exc:
        raise CliError(f"input: cannot read {path}: {exc.strerror}") from None
    return gzip.GzipFile(fileobj=raw, mode="rb") if _is_gz(path) else raw  # type: ignore[return-value]


def numbered_lines(stream: BinaryIO, path: str) -> Iterator[tuple[int, bytes]]:
    """(line number, its bytes without the newline) of every non-blank line, read as it goes; CliError naming the
    path where it cannot be read (a corrupt gzip stream, a read error)."""
    try:
        for number, line in enumerate(stream, 1):
            line = line.rstrip(b"\r\n")
            if line.strip():
                yield number, line
    except (OSError, EOFError, zlib.error) as exc:
        raise CliError(f"input: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None


def count_lines(path: str) -> int | None:
    """The input's non-blank lines (read once, for progress), None for standard input."""
    if path == STDIO:
        return None
    with open_input(path) as stream:
        return sum(1 for _ in numbered_lines(stream, path))


def complete_lines(path: str) -> tuple[list[bytes], int]:
    """The complete lines an earlier run left in `path` (none if it does not exist) and the byte length they
    take (what a torn last line is cut back to)."""
    if not os.path.exists(path):
        return [], 0
    try:
        if _is_gz(path):
            data = bytearray()
            with gzip.open(path, "rb") as stream:
                try:
                    while chunk := stream.read(1 << 20):
                        data += chunk
                except (EOFError, OSError, zlib.error):
                    pass  # a member torn by a kill: what came before it stands
            data = bytes(data)
        else:
            data = Path(path).read_bytes()
    except OSError as exc:
        raise CliError(f"output: cannot read {path} to resume: {exc.strerror}") from None
    lines, size = [], 0
    for line in data.split(b"\n")[:-1]:  # the part after the last newline is torn
        try:
            json.loads(line)
        except ValueError:
            break  # a line torn and then written past: nothing after it is trusted
        lines.append(line)
        size += len(line) + 1
    return lines, size


@dataclass
class LineFile:
    """One output (results or errors) opened for appending whole lines; `count`: the lines it holds."""

    path: str
    stream: BinaryIO
    count: int = 0

    def write(self, record: dict) -> None:
        """Append one whole line (CliError naming the path when it cannot be written: a full disk)."""
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        try:
            self.stream.write(data)
            self.stream.flush()
        except OSError as exc:
            raise CliError(f"output: cannot write {self.path}: {exc.strerror}") from None
        self.count += 1

    def close(self) -> None:
        try:
            self.stream.flush()
            if self.stream is not sys.stdout.buffer:
                if not isinstance(self.stream, gzip.GzipFile):  # a gzip member is whole once closed
                    os.fsync(self.stream.fileno())
                self.stream.close()
        except OSError as exc:
            raise CliError(f"output: cannot write {self.path}: {exc.strerror}") from None


def open_output(path: str, kept: list[bytes], size: int) -> LineFile:
    """`path` opened to append after its `kept` complete lines (taking `size` bytes; a torn tail is cut off, a
    `.gz` file written again with them); standard output for `-`. CliError naming the path."""
    if path == STDIO:
        return LineFile(path, sys.stdout.buffer)
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        if _is_gz(path):
            if kept or os.path.exists(path):
                with gzip.open(path + ".part", "wb") as again:
                    again.writelines(line + b"\n" for line in kept)
                os.replace(path + ".part", path)
            stream: BinaryIO = gzip.open(path, "ab")  # type: ignore[assignment]
        else:
            stream = open(path, "ab")
            stream.truncate(size)
    except OSError as exc:
        raise CliError(f"output: cannot write {path}: {exc.strerror}") from None
    return LineFile(path, stream, len(kept))


def errors_path(output: str) -> str:
    """Where lines that cannot be compressed go by default: beside the output (`out.errors.jsonl`)."""
    if output == STDIO:
        return "ilre-batch.errors.jsonl"
    base = output[:-3] if _is_gz(output) else output
    stem = base[:-6] if base.endswith(".jsonl") else base
    return stem + ".errors.jsonl" + (".gz" if _is_gz(output) else "")


def remove(path: str) -> None:
    """Start over: forget what an earlier run wrote to `path`."""
    if path != STDIO:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise CliError(f"output: cannot remove {path} to start over: {exc.strerror}") from None

