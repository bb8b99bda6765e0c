"""`ilre batch`: one JSONL line in, one JSONL line out, in order; a bad line never stops the run."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..engine.engine import Engine
from ..engine.messages import CompressRequest, InputError
from .output import CliError


class BatchError(Exception):
    """The run itself cannot proceed (unreadable input, unwritable output)."""


def process_line(engine: Engine, raw: bytes, number: int, defaults: dict[str, Any]) -> dict[str, Any]:
    """One input line -> its output object: the result, or {"id", "error"} for bad input."""
    line_id: Any = None
    try:
        data = json.loads(raw.decode("utf-8"))
        if isinstance(data, dict):
            line_id = data.get("id")
        return engine.compress(CompressRequest.from_json(data, defaults)).to_dict()
    except UnicodeDecodeError as exc:
        return {"id": line_id, "error": f"line {number}: not valid UTF-8 (offset {exc.start})"}
    except json.JSONDecodeError as exc:
        return {"id": line_id, "error": f"line {number}: not valid JSON ({exc.msg} at column {exc.colno})"}
    except InputError as exc:
        return {"id": line_id, "error": str(exc)}
    except TypeError as exc:  # e.g. a field of the wrong JSON type that the dataclass rejects
        return {"id": line_id, "error": f"request: {exc}"}


def run_batch_file(engine: Engine, source: Path, target: Path, defaults: dict[str, Any]) -> int:
    """Compress every non-blank line of `source` into `target`; returns 0 (bad lines are reported inline)."""
    try:
        lines = source.read_bytes().splitlines()
    except OSError as exc:
        raise CliError(f"input: cannot read {source}: {exc.strerror}") from None
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    try:
        out = target.open("w", encoding="utf-8")
    except OSError as exc:
        raise CliError(f"output: cannot write {target}: {exc.strerror}") from None
    failures = 0
    with out, tqdm(numbered, desc="compress", unit="req", file=sys.stderr, disable=None) as progress:
        for number, raw in progress:
            record = process_line(engine, raw, number, defaults)
            failures += "error" in record
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            out.flush()
    print(f"{len(numbered) - failures} compressed, {failures} failed -> {target}", file=sys.stderr)
    return 0
