"""The batch job's files: the input read line by line as it goes (a path, `-` for standard input, `.gz` by its
name), and the output and error files written line by line, each line whole, in input order, so that the same
command run again after any interruption finds what is done and goes on after it.

Beside a file output the job keeps its state (`<output>.ilre-batch`, rewritten after each line): how many input
lines are done, a SHA-256 of those lines' bytes (so that another input, ids or not, is refused) and where each file
ends. Run again, the job reads only what was written past that point (a line written as the state was not yet, or a
line torn by a kill, which is cut off) and never holds the files in memory. A `.gz` output is written one gzip
member per line, so a torn member is cut off in place too. An output without a state beside it (an older job's) is
taken on only where every finished line names its input line (id or custom_id), read as it goes. Standard output is
never read back: a job written there starts from the first line.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
import zlib
from dataclasses import dataclass, field
from typing import BinaryIO, Iterator

from ..output import CliError

STDIO = "-"
STATE_SUFFIX = ".ilre-batch"


def is_gz(path: str) -> bool:
    return path.endswith(".gz")


class _FdLines:
    """Standard input read from its file descriptor, with no buffered object's lock: a read blocked on it in a
    daemon thread cannot hold up the interpreter's exit (Ctrl-C)."""

    def __init__(self, fd: int):
        self.fd, self.buffer, self.eof = fd, b"", False

    def readline(self, limit: int) -> bytes:
        """Up to and with the next newline, at most `limit` bytes; b"" at the end."""
        while not self.eof and b"\n" not in self.buffer[:limit] and len(self.buffer) < limit:
            chunk = os.read(self.fd, 1 << 16)
            self.eof = not chunk
            self.buffer += chunk
        end = self.buffer.find(b"\n", 0, limit)
        n = end + 1 if end >= 0 else min(limit, len(self.buffer))
        line, self.buffer = self.buffer[:n], self.buffer[n:]
        return line


def open_input(path: str) -> BinaryIO:
    """The input as a binary stream (standard input for `-`, decompressed for `.gz`); CliError naming the path."""
    if path == STDIO:
        return _FdLines(sys.stdin.fileno())  # type: ignore[return-value]
    try:
        raw = open(path, "rb")
    except OSError as exc:
        raise CliError(f"input: cannot read {path}: {exc.strerror}") from None
    return gzip.GzipFile(fileobj=raw, mode="rb") if is_gz(path) else raw  # type: ignore[return-value]


def numbered_lines(stream: BinaryIO, path: str, max_bytes: int) -> Iterator[tuple[int, bytes | int]]:
    """(line number, its bytes without the newline) of every non-blank line, read as it goes; a line over
    `max_bytes` is read past in pieces and given as its length instead (never held whole). CliError naming the
    path where it cannot be read (a corrupt gzip stream, a read error)."""
    try:
        number = 0
        while True:
            line = stream.readline(max_bytes + 1)
            if not line:
                return
            number += 1
            if len(line) > max_bytes and not line.endswith(b"\n"):  # too long: skip to its end, counting
                size = len(line)
                while (more := stream.readline(1 << 20)) and not more.endswith(b"\n"):
                    size += len(more)
                yield number, size + len(more.rstrip(b"\r\n"))
                continue
            line = line.rstrip(b"\r\n")
            if line.strip():
                yield number, line
    except (OSError, EOFError, zlib.error) as exc:
        raise CliError(f"input: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None


@dataclass
class JobState:
    """Where a job stands: input lines done and the SHA-256 of their bytes (each line and a newline), and for the
    output and the error file the lines each holds and the byte where its last line ends."""

    lines: int = 0
    digest: str = hashlib.sha256().hexdigest()
    files: dict[str, list[int]] = field(default_factory=lambda: {"output": [0, 0], "errors": [0, 0]})

    @classmethod
    def read(cls, output: str) -> "JobState | None":
        """The state kept beside `output`, None where there is none; CliError where it cannot be read."""
        try:
            data = json.loads(open(output + STATE_SUFFIX, "rb").read())
            return cls(data["lines"], data["sha256"], {k: list(v) for k, v in data["files"].items()})
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CliError(f"output: cannot read the job's state {output + STATE_SUFFIX}: {exc} (--restart starts "
                           "over)") from None

    def write(self, output: str) -> None:
        """Replace the state beside `output` (whole: written aside, then renamed over it)."""
        data = json.dumps({"lines": self.lines, "sha256": self.digest, "files": self.files}).encode()
        try:
            with open(output + STATE_SUFFIX + ".part", "wb") as f:
                f.write(data)
            os.replace(output + STATE_SUFFIX + ".part", output + STATE_SUFFIX)
        except OSError as exc:
            raise CliError(f"output: cannot write {output + STATE_SUFFIX}: {exc.strerror}") from None


class InputDigest:
    """The running SHA-256 of the input lines done (each line's bytes and a newline)."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()

    def add(self, raw: bytes | int) -> None:
        self._hash.update((raw if isinstance(raw, bytes) else f"<{raw} bytes>".encode()) + b"\n")

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def tail_lines(path: str, offset: int) -> tuple[list[bytes], int]:
    """The complete lines of `path` past byte `offset` (where the state says the file's last line ended: at most a
    line or two written after it), and the byte where the last complete one ends; a torn line or gzip member after
    them is left out. CliError where the file is shorter than `offset` (not this job's file)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size < offset:
                raise CliError(f"output: {path} holds {size} bytes, less than the {offset} its job's state says: "
                               "not this job's file (--restart starts over)")
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        if offset:
            raise CliError(f"output: {path} is gone but its job's state counts lines in it (--restart starts over)")
        return [], 0
    except OSError as exc:
        raise CliError(f"output: cannot read {path} to resume: {exc.strerror}") from None
    lines, end = [], offset
    if is_gz(path):  # one member per line
        while data:
            member = zlib.decompressobj(wbits=31)
            try:
                text = member.decompress(data)
            except zlib.error:
                break
            if not member.eof or not _whole(text):
                break
            used = len(data) - len(member.unused_data)
            lines.append(text[:-1])
            end, data = end + used, member.unused_data
        return lines, end
    for line in data.split(b"\n")[:-1]:  # the part after the last newline is torn
        if not _whole(line + b"\n"):
            break
        lines.append(line)
        end += len(line) + 1
    return lines, end


def _whole(text: bytes) -> bool:
    """Whether `text` is one whole written line: JSON and a newline."""
    if not text.endswith(b"\n"):
        return False
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def legacy_lines(path: str) -> Iterator[bytes]:
    """The complete lines of an output written without a state beside it, read as they go (a torn last line or
    gzip member left out)."""
    if not os.path.exists(path):
        return
    try:
        with (gzip.open(path, "rb") if is_gz(path) else open(path, "rb")) as f:
            try:
                for line in f:
                    if not _whole(line):
                        return
                    yield line[:-1]
            except (EOFError, OSError, zlib.error):
                return  # a member torn by a kill: what came before it stands
    except OSError as exc:
        raise CliError(f"output: cannot read {path} to resume: {exc.strerror}") from None


@dataclass
class LineFile:
    """One output (results or errors) opened for appending whole lines (a `.gz` one a gzip member per line);
    `count`: the lines it holds, `size`: the byte where the last one ends."""

    path: str
    stream: BinaryIO
    count: int = 0
    size: int = 0

    def write(self, record: dict) -> None:
        """Append one whole line (CliError naming the path when it cannot be written: a full disk)."""
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        if is_gz(self.path):
            data = gzip.compress(data, mtime=0)
        try:
            self.stream.write(data)
            self.stream.flush()
        except OSError as exc:
            raise CliError(f"output: cannot write {self.path}: {exc.strerror}") from None
        self.count += 1
        self.size += len(data)

    def close(self) -> None:
        try:
            self.stream.flush()
            if self.stream is not sys.stdout.buffer:
                os.fsync(self.stream.fileno())
                self.stream.close()
        except OSError as exc:
            raise CliError(f"output: cannot write {self.path}: {exc.strerror}") from None


def open_output(path: str, count: int, size: int) -> LineFile:
    """`path` opened to append after its `count` complete lines, which end at byte `size` (what follows them, a torn
    line, is cut off); standard output for `-`. CliError naming the path."""
    if path == STDIO:
        return LineFile(path, sys.stdout.buffer)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        stream = open(path, "ab")
        stream.truncate(size)
    except OSError as exc:
        raise CliError(f"output: cannot write {path}: {exc.strerror}") from None
    return LineFile(path, stream, count, size)


def errors_path(output: str) -> str:
    """Where lines that cannot be compressed go by default: beside the output (`out.errors.jsonl`)."""
    if output == STDIO:
        return "ilre-batch.errors.jsonl"
    base = output[:-3] if is_gz(output) else output
    stem = base[:-6] if base.endswith(".jsonl") else base
    return stem + ".errors.jsonl" + (".gz" if is_gz(output) else "")


def remove(path: str) -> None:
    """Start over: forget what an earlier run wrote to `path`."""
    if path != STDIO:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise CliError(f"output: cannot remove {path} to start over: {exc.strerror}") from None
