"""`ilre batch` resuming as a user meets it (real processes): another input's output is refused whether its lines
carry ids or not; a `.gz` job killed mid-run and run again gives the uninterrupted output; resuming reads past the
finished lines with memory flat in their number; Ctrl-C stops a job reading standard input at once; a line over
the byte cap, or failing every try, becomes its error line and the job goes on."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path


from ilre.cli.batch.files import STATE_SUFFIX, InputDigest, JobState
from tests.cli.test_batch_job import ILRE, SMALL, batch, corpus, read_lines, stable, summary, write_lines


def _idless(n: int, seed: int) -> list[dict]:
    return [{"context": f"Line {i} of set {seed}: the code is {seed * 100 + i}. " * 8, "query": "What is the code?",
             "budget": 24} for i in range(n)]


def test_an_id_less_jobs_output_is_refused_to_another_input(tmp_path):
    output = tmp_path / "out.jsonl"
    first = batch("--input", str(write_lines(tmp_path / "a.jsonl", _idless(3, 1))), "--output", str(output), *SMALL)
    assert first.returncode == 0, first.stderr.decode()
    other = batch("--input", str(write_lines(tmp_path / "b.jsonl", _idless(5, 2))), "--output", str(output), *SMALL)
    assert other.returncode == 2 and "does not continue" in other.stderr.decode(), other.stderr.decode()
    assert len(read_lines(output)) == 3  # untouched
    (tmp_path / f"out.jsonl{STATE_SUFFIX}").unlink()  # no state: id-less lines cannot be told apart, refused too
    other = batch("--input", str(tmp_path / "b.jsonl"), "--output", str(output), *SMALL)
    assert other.returncode == 2 and "name no id" in other.stderr.decode(), other.stderr.decode()


def test_a_gz_job_killed_and_run_again_gives_the_uninterrupted_output(tmp_path):
    source = write_lines(tmp_path / "in.jsonl.gz", corpus(12))
    whole = batch("--input", str(source), "--output", str(tmp_path / "whole.jsonl.gz"), *SMALL)
    assert whole.returncode == 0, whole.stderr.decode()
    output = tmp_path / "out.jsonl.gz"
    args = ["--input", str(source), "--output", str(output), *SMALL, "--json"]
    proc = subprocess.Popen([*ILRE, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    state = Path(str(output) + STATE_SUFFIX)
    deadline = time.monotonic() + 300
    while not (state.exists() and json.loads(state.read_text() or "{}").get("lines", 0) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(random.Random(3).uniform(0, 0.05))
    proc.send_signal(signal.SIGKILL)
    proc.wait(60)
    again = batch(*args)
    assert again.returncode == 0, again.stderr.decode()
    assert 3 <= summary(again)["done_before"] < 12
    assert stable(read_lines(output)) == stable(read_lines(tmp_path / "whole.jsonl.gz"))


def _finished_job(where: Path, lines: int) -> tuple[Path, Path]:
    """An input of `lines` + 1 lines and an output holding the first `lines` as finished, with its state."""
    source, output = where / "in.jsonl", where / "out.jsonl"
    digest, size = InputDigest(), 0
    with open(source, "wb") as inp, open(output, "wb") as out:
        for i in range(lines + 1):
            raw = json.dumps({"id": f"l{i}", "context": f"Context {i} " * 4, "query": "Which?"}).encode()
            inp.write(raw + b"\n")
            if i < lines:
                record = (json.dumps({"id": f"l{i}", "compressed_context": f"Context {i}"}) + "\n").encode()
                out.write(record)
                size += len(record)
                digest.add(raw)
    JobState(lines, digest.hexdigest(), {"output": [lines, size], "errors": [0, 0]}).write(str(output))
    return source, output


def test_resuming_reads_past_finished_lines_in_flat_memory(tmp_path):
    """A job with 1,000 and one with 100,000 finished lines, resumed against a service that is not there: each reads
    past its finished lines (the state's digest checked), then stops on the first line left; its peak RSS is the
    same within a few MiB (the files are never held)."""
    peaks = {}
    for lines in (1000, 100_000):
        where = tmp_path / str(lines)
        where.mkdir()
        source, output = _finished_job(where, lines)
        args = [*ILRE, "--input", str(source), "--output", str(output), "--server", "http://127.0.0.1:9",
                "--retry-s", "0.2", "--timeout", "2"]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _, _, usage = os.wait4(proc.pid, 0)
        err = proc.stderr.read().decode()
        assert f"{lines} lines done" in err, err  # it resumed past them all, then the service was missing
        peaks[lines] = usage.ru_maxrss / 1024
    print(f"peak RSS resuming: {peaks}")
    assert peaks[100_000] - peaks[1000] < 8, peaks


def test_ctrl_c_stops_a_job_reading_standard_input_at_once(tmp_path):
    output = tmp_path / "out.jsonl"
    proc = subprocess.Popen([*ILRE, "--input", "-", "--output", str(output), *SMALL], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    for line in corpus(2):
        proc.stdin.write((json.dumps(line) + "\n").encode())
    proc.stdin.flush()  # and no more: the job waits on standard input, which stays open
    deadline = time.monotonic() + 300
    while not (output.exists() and output.read_bytes().count(b"\n") >= 2):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(20) == 130
    assert time.monotonic() - start < 10
    proc.stdin.close()
    assert len(read_lines(output)) == 2


def test_a_line_over_the_byte_cap_becomes_its_error_line(tmp_path):
    lines = corpus(3)
    lines[1]["context"] = "x" * 5000
    source = write_lines(tmp_path / "in.jsonl", lines)
    proc = batch("--input", str(source), "--output", str(tmp_path / "out.jsonl"), *SMALL, "--max-line-bytes", "2000",
                 "--json")
    assert proc.returncode == 0, proc.stderr.decode()
    records = read_lines(tmp_path / "out.jsonl")
    assert [r["id"] for r in records] == ["line-0", None, "line-2"]
    assert "bytes exceed the limit of 2000" in records[1]["error"] and "--max-line-bytes" in records[1]["error"]
    assert summary(proc)["errors"] == 1


def test_a_line_failing_every_try_becomes_its_error_line_and_the_job_goes_on(engine, tmp_path):
    """A line the service answers with INTERNAL each time (a fault injected in the engine's compress for that line's
    query): after LINE_TRIES tries its error line, the other lines compressed."""
    from ilre.cli.batch import BatchJob, LineRules, run_job
    from ilre.cli.batch.backends import LocalBackend
    from ilre.cli.batch.job import LINE_TRIES
    from ilre.service.common.errors import Code, ServiceError

    lines = corpus(3)
    source = write_lines(tmp_path / "in.jsonl", lines)
    backend = LocalBackend(engine, 2, 120, retry_s=1)
    run, tries = backend.run, []

    async def faulty(fields):
        if fields.get("query") == lines[1]["query"]:
            tries.append(1)
            raise ServiceError(Code.INTERNAL, "the worker running it died")
        return await run(fields)

    backend.line_runner = lambda: faulty
    job = BatchJob(str(source), str(tmp_path / "out.jsonl"), str(tmp_path / "out.errors.jsonl"),
                   LineRules({"layer": 6}), 2)
    assert run_job(job, backend) == 0
    records = read_lines(tmp_path / "out.jsonl")
    assert [r["id"] for r in records] == ["line-0", "line-1", "line-2"] and len(tries) == LINE_TRIES
    assert records[1]["error"] == f"line 2: failed {LINE_TRIES} times: INTERNAL: the worker running it died"
    assert "compressed_context" in records[0] and "compressed_context" in records[2]
