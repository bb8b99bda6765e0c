"""`ilre batch` as a corpus job, run as a user runs it (real processes, the embedded model): interrupted by SIGINT
and SIGKILL at random points and run again, it finishes with every line exactly once and equal to an uninterrupted
run's, redoing none; a finished job run again does nothing; standard input to standard output in a pipe; gzip in
and out; OpenAI batch request lines compressed into the same shape, their failures in the Batch API's error shape;
every bad input named."""

from __future__ import annotations

import gzip
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ilre.evaluation.tasks.haystack import pydoc_text

ILRE = [sys.executable, "-m", "ilre.cli", "batch"]
SMALL = ["--layer", "6", "--in-flight", "4"]  # a shallow reader: the job's behaviour is the point, not the selection
VOLATILE = ("timings_ms", "document_id")  # measured, and keyed by the process's own document secret


def corpus(lines: int, chars: int = 900) -> list[dict]:
    """`lines` ilre lines of Python's reference text (~200 tokens each), a fact planted in each."""
    text = pydoc_text()
    out = []
    for i in range(lines):
        part = text[i * chars:(i + 1) * chars]
        out.append({"id": f"line-{i}", "context": f"{part[:chars // 2]}\nThe batch code of line {i} is {4000 + i}.\n"
                    f"{part[chars // 2:]}", "query": f"What is the batch code of line {i}?", "budget": 48})
    return out


def write_lines(path: Path, lines: list[dict]) -> Path:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)
    return path


def read_lines(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def stable(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in records]


def batch(*args: str, stdin: bytes | None = None, timeout: float = 600, cwd: Path | None = None
          ) -> subprocess.CompletedProcess:
    return subprocess.run([*ILRE, *args], input=stdin, capture_output=True, timeout=timeout, cwd=cwd)


def summary(proc: subprocess.CompletedProcess) -> dict:
    """The run's JSON summary (--json): the last line of standard output."""
    return json.loads(proc.stdout.decode().splitlines()[-1])


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """(input path, the uninterrupted run's lines) for a 24-line corpus."""
    where = tmp_path_factory.mktemp("batch")
    source = write_lines(where / "in.jsonl", corpus(24))
    proc = batch("--input", str(source), "--output", str(where / "whole.jsonl"), *SMALL, "--json")
    assert proc.returncode == 0, proc.stderr.decode()
    assert summary(proc)["lines"] == 24 and summary(proc)["errors"] == 0
    return source, read_lines(where / "whole.jsonl")


def interrupted(args: list[str], output: Path, after: int, sig: int, rng: random.Random) -> int:
    """Run `ilre batch args`, send `sig` once the output holds `after` lines (and a random moment more), wait for it
    to end: its exit status."""
    proc = subprocess.Popen([*ILRE, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not (output.exists() and output.read_bytes().count(b"\n") >= after):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode() if proc.stderr else ""
        time.sleep(0.02)
    time.sleep(rng.uniform(0, 0.05))  # a random moment within the line being written or computed
    assert proc.poll() is None, "the job ended before it could be interrupted"
    proc.send_signal(sig)
    proc.wait(60)
    return proc.returncode


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["sigint", "sigkill"])
def test_an_interrupted_job_run_again_finishes_every_line_once(job, tmp_path, sig):
    source, whole = job
    rng = random.Random(int(sig))
    output = tmp_path / "out.jsonl"
    args = ["--input", str(source), "--output", str(output), *SMALL, "--json"]
    status = interrupted(args, output, rng.randrange(2, 12), sig, rng)
    assert status == (130 if sig == signal.SIGINT else -signal.SIGKILL)
    done = output.read_bytes()
    finished = done.count(b"\n")
    assert 2 <= finished < 24
    again = batch(*args)
    assert again.returncode == 0, again.stderr.decode()
    ran = summary(again)
    assert ran["done_before"] == finished and ran["lines"] == 24 - finished  # only the rest was done
    records = read_lines(output)
    assert [r["id"] for r in records] == [r["id"] for r in whole]  # each once, in order
    assert stable(records) == stable(whole)
    assert output.read_bytes().startswith(done[:done.rfind(b"\n") + 1])  # the finished lines untouched

    finished_again = batch(*args)  # a finished job: nothing to do
    assert finished_again.returncode == 0 and "nothing to do" in finished_again.stderr.decode()
    assert read_lines(output) == records


def test_a_torn_last_line_is_cut_and_done_again(job, tmp_path):
    source, whole = job
    output = tmp_path / "out.jsonl"
    lines = (json.dumps(r) + "\n" for r in whole[:5])
    output.write_text("".join(lines) + json.dumps(whole[5])[:40])  # a kill in the middle of a write
    proc = batch("--input", str(source), "--output", str(output), *SMALL, "--json")
    assert proc.returncode == 0, proc.stderr.decode()
    assert summary(proc)["done_before"] == 5
    assert stable(read_lines(output)) == stable(whole)


def test_another_inputs_output_is_not_taken_on(job, tmp_path):
    source, whole = job
    output = tmp_path / "out.jsonl"
    output.write_text(json.dumps({**whole[0], "id": "someone-else"}) + "\n")
    proc = batch("--input", str(source), "--output", str(output), *SMALL)
    assert proc.returncode == 2 and "does not continue" in proc.stderr.decode() and "--restart" in proc.stderr.decode()
    proc = batch("--input", str(source), "--output", str(output), *SMALL, "--restart", "--json")
    assert proc.returncode == 0 and summary(proc)["done_before"] == 0
    assert stable(read_lines(output)) == stable(whole)


def test_standard_input_to_standard_output_and_gzip(job, tmp_path):
    source, whole = job
    piped = tmp_path / "piped"
    piped.mkdir()
    proc = batch("--input", "-", "--output", "-", *SMALL, stdin=source.read_bytes(), cwd=piped)
    assert proc.returncode == 0, proc.stderr.decode()
    assert stable([json.loads(line) for line in proc.stdout.decode().splitlines()]) == stable(whole)
    assert not list(piped.iterdir())  # no file named "-", no empty error file: nothing failed

    packed = write_lines(tmp_path / "in.jsonl.gz", read_lines(source))
    proc = batch("--input", str(packed), "--output", str(tmp_path / "out.jsonl.gz"), *SMALL)
    assert proc.returncode == 0, proc.stderr.decode()
    assert stable(read_lines(tmp_path / "out.jsonl.gz")) == stable(whole)


def chat_line(custom_id: str, tool_result: str, question: str) -> dict:
    messages = [{"role": "system", "content": "Answer from the tool's results."},
                {"role": "user", "content": "Read the notes."},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "read_notes", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": tool_result},
                {"role": "user", "content": question}]
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "smollm2", "messages": messages, "max_tokens": 16}}


def test_openai_batch_lines_come_out_in_their_shape_and_failures_in_the_error_shape(tmp_path):
    text = pydoc_text()[:12000]
    long = f"{text[:6000]}\nThe audit code of the notes is 7730.\n{text[6000:]}"
    lines = [chat_line("chat-1", long, "What is the audit code of the notes?"),
             {"custom_id": "completion-1", "method": "POST", "url": "/v1/completions",
              "body": {"model": "smollm2", "prompt": long + "\nThe audit code of the notes is", "max_tokens": 4}},
             chat_line("short-1", "Nothing much.", "Anything?"),
             {"custom_id": "bad-url", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}},
             {"custom_id": "bad-body", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": "hi"}}]
    source = write_lines(tmp_path / "requests.jsonl", lines)
    output = tmp_path / "compressed.jsonl"
    proc = batch("--input", str(source), "--output", str(output), "--budget", "300", "--json")  # the default reader
    assert proc.returncode == 0, proc.stderr.decode()
    ran = summary(proc)
    assert (ran["lines"], ran["errors"], ran["passed_through"]) == (5, 2, 0)
    assert ran["errors_file"] == str(tmp_path / "compressed.errors.jsonl")
    chat, completion, short = read_lines(output)
    assert [r["custom_id"] for r in (chat, completion, short)] == ["chat-1", "completion-1", "short-1"]
    assert {k: v for k, v in chat.items() if k != "body"} == {k: v for k, v in lines[0].items() if k != "body"}
    sent, kept = lines[0]["body"]["messages"], chat["body"]["messages"]
    assert [m for i, m in enumerate(kept) if i != 3] == [m for i, m in enumerate(sent) if i != 3]  # only the tool result
    assert "7730" in kept[3]["content"] and len(kept[3]["content"]) < len(long) // 3
    assert "7730" in completion["body"]["prompt"] and completion["body"]["prompt"].endswith("The audit code of the notes is")
    assert completion["body"]["max_tokens"] == 4 and len(completion["body"]["prompt"]) < len(lines[1]["body"]["prompt"]) // 3
    assert short == lines[2]  # fits the budget: unchanged
    errors = read_lines(tmp_path / "compressed.errors.jsonl")
    assert [e["custom_id"] for e in errors] == ["bad-url", "bad-body"]
    assert all(e["response"] is None and set(e["error"]) == {"code", "message"} for e in errors)
    assert "url: must be one of" in errors[0]["error"]["message"] and "line 4" in errors[0]["error"]["message"]
    assert "body.messages" in errors[1]["error"]["message"]

    passed = tmp_path / "passed.jsonl"
    proc = batch("--input", str(source), "--output", str(passed), "--budget", "300", "--pass-errors")
    assert proc.returncode == 0 and read_lines(passed)[3:] == lines[3:]  # unchanged, in their place
    assert not (tmp_path / "passed.errors.jsonl").exists()  # none went to an error file
    assert "2 failed (2 passed through unchanged)" in proc.stderr.decode()


def test_bad_input_and_output_are_named(tmp_path):
    source = write_lines(tmp_path / "in.jsonl", corpus(1))
    proc = batch("--input", str(tmp_path / "absent.jsonl"), "--output", str(tmp_path / "o.jsonl"))
    assert proc.returncode == 2 and f"input: cannot read {tmp_path / 'absent.jsonl'}" in proc.stderr.decode()
    (tmp_path / "broken.jsonl.gz").write_bytes(b"not gzip at all")
    proc = batch("--input", str(tmp_path / "broken.jsonl.gz"), "--output", str(tmp_path / "o.jsonl"))
    assert proc.returncode == 2 and "input: cannot read" in proc.stderr.decode() and "broken.jsonl.gz" in proc.stderr.decode()
    blocked = tmp_path / "ro"
    blocked.mkdir()
    os.chmod(blocked, 0o500)
    try:
        proc = batch("--input", str(source), "--output", str(blocked / "o.jsonl"), *SMALL)
        if os.geteuid() != 0:  # root writes anywhere: a directory in the output's place instead
            assert proc.returncode == 2 and f"output: cannot write {blocked / 'o.jsonl'}" in proc.stderr.decode()
    finally:
        os.chmod(blocked, 0o700)
    proc = batch("--input", str(source), "--output", str(tmp_path), *SMALL)
    assert proc.returncode == 2 and f"output: cannot" in proc.stderr.decode() and str(tmp_path) in proc.stderr.decode()
    assert "Traceback" not in proc.stderr.decode()
    proc = batch("--input", str(source), "--output", "-", "--in-flight", "0")
    assert proc.returncode == 2 and "--in-flight" in proc.stderr.decode()


def test_a_context_grown_in_one_job_takes_its_first_reading_on(tmp_path):
    """A context and the same context grown by a tool result, one after the other (an agent's transcript): the grown
    line takes the first's encoding on (`resumed_tokens`), with the stream a batch job holds (`--deepen hold`, its
    default; the suite's environment sets off) its candidates start there, and the fact in the new part is kept; with `--deepen off` the grown line is
    what the same line alone in a fresh job gives. The first line's candidates start from its own stream under hold,
    as they do under off when the line asks for it (`first_from_stream`), and from layer 1 under off."""
    text = pydoc_text()
    first = text[:6000]
    grown = f"{first}{text[6000:7400]}\nThe tool returned the code 7781.\n{text[7400:8800]}"
    ask = {"query": "What code did the tool return?", "budget": 96}
    lines = [{"id": "first", "context": first, **ask}, {"id": "grown", "context": grown, **ask}]
    source = write_lines(tmp_path / "in.jsonl", lines)
    alone = write_lines(tmp_path / "grown-alone.jsonl", lines[1:])
    asked = write_lines(tmp_path / "first-streamed.jsonl",
                        [{**lines[0], "strategy_options": {"first_from_stream": True}}])
    outputs = {}
    runs = {"hold": ["--deepen", "hold"], "off": ["--deepen", "off"], "alone": ["--deepen", "off"],
            "asked": ["--deepen", "off"]}
    for name, args in runs.items():
        given = {"alone": alone, "asked": asked}.get(name, source)
        proc = batch("--input", str(given), "--output", str(tmp_path / f"{name}.jsonl"), "--in-flight", "1", *args)
        assert proc.returncode == 0, proc.stderr.decode()
        outputs[name] = {line["id"]: line for line in read_lines(tmp_path / f"{name}.jsonl")}
    for name in ("hold", "off"):
        assert outputs[name]["first"].get("resumed_tokens", 0) == 0
        assert outputs[name]["grown"].get("resumed_tokens", 0) >= 1024, outputs[name]["grown"]
        assert "7781" in outputs[name]["grown"]["compressed_context"]
    assert outputs["alone"]["grown"].get("resumed_tokens", 0) == 0
    same = ("kept_indices", "token_ids", "compressed_context")
    assert all(outputs["off"]["grown"][k] == outputs["alone"]["grown"][k] for k in same)
    assert outputs["hold"]["first"]["kept_indices"] == outputs["asked"]["first"]["kept_indices"]  # from its stream
