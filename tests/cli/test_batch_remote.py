"""`ilre batch` sending its lines out (real processes, real servers): to running services over HTTP and gRPC at
once (round robin), to the worker pool behind a real Redis queue, and to a service that is not up yet when the
job starts (its refusals retried until it is): every line's result equal to the engine's own answer, in input
order."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ilre.contract.messages import CompressRequest
from ilre.service.server import ServiceThread

from tests.cli.test_batch_job import corpus, read_lines, write_lines
from tests.service.conftest import WorkerThread, comparable, free_port, service_config

ILRE = [sys.executable, "-m", "ilre.cli", "batch"]


@pytest.fixture(scope="module")
def lines():
    return corpus(10)


def expected(engine, lines: list[dict]) -> list[dict]:
    return [comparable(engine.compress(CompressRequest(**line))) for line in lines]


def batch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*ILRE, *args, "--json"], capture_output=True, timeout=600)


def test_lines_sent_to_services_over_http_and_grpc_come_back_in_order(engine, local_service, lines, tmp_path):
    source, output = write_lines(tmp_path / "in.jsonl", lines), tmp_path / "out.jsonl"
    proc = batch("--input", str(source), "--output", str(output), "--server", f"http://127.0.0.1:{local_service.http_port}",
                 "--server", f"127.0.0.1:{local_service.grpc_port}", "--in-flight", "4")
    assert proc.returncode == 0, proc.stderr.decode()
    records = read_lines(output)
    assert [r["id"] for r in records] == [line["id"] for line in lines]
    assert [comparable(r) for r in records] == expected(engine, lines)
    assert json.loads(proc.stdout.decode().splitlines()[-1])["errors"] == 0


def test_lines_sent_to_the_worker_pool_through_redis(engine, redis_server, lines, tmp_path):
    config = service_config(redis_url=redis_server.url, redis_prefix="batch-job", redis_retry_s=1.0)
    source, output = write_lines(tmp_path / "in.jsonl", lines), tmp_path / "out.jsonl"
    with WorkerThread(engine, config, name="batch-worker"):
        proc = batch("--input", str(source), "--output", str(output), "--redis-url", redis_server.url,
                     "--redis-prefix", "batch-job", "--in-flight", "8")
    assert proc.returncode == 0, proc.stderr.decode()
    assert [comparable(r) for r in read_lines(output)] == expected(engine, lines)


def test_a_service_that_comes_up_late_is_waited_for(engine, lines, tmp_path):
    """The job starts before its service: refused connections are retried (--retry-s) until the service is up."""
    source, output = write_lines(tmp_path / "in.jsonl", lines[:3]), tmp_path / "out.jsonl"
    port = free_port()
    proc = subprocess.Popen([*ILRE, "--input", str(source), "--output", str(output), "--server",
                             f"http://127.0.0.1:{port}", "--retry-s", "120", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60  # the output opens just before the first request (later on a loaded machine)
    while not output.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # the first requests are refused
    assert proc.poll() is None and not output.read_bytes()  # waiting, nothing written
    with ServiceThread(service_config(http_port=port), engine):
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()
    ran = json.loads(out.decode().splitlines()[-1])
    assert ran["lines"] == 3 and ran["retries"] > 0
    assert [comparable(r) for r in read_lines(output)] == expected(engine, lines[:3])


def test_a_service_gone_for_good_stops_the_run_naming_it(tmp_path, lines):
    source, output = write_lines(tmp_path / "in.jsonl", lines[:2]), tmp_path / "out.jsonl"
    proc = batch("--input", str(source), "--output", str(output), "--server", f"http://127.0.0.1:{free_port()}",
                 "--retry-s", "1")
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "service: UNAVAILABLE" in err and "0 lines done" in err and "goes on" in err
    assert "Traceback" not in err and Path(output).read_bytes() == b""


def test_an_openai_batch_file_gives_the_same_lines_in_process_over_http_grpc_and_redis(engine, local_service,
                                                                                      redis_server, tmp_path):
    """Chat lines whose earlier messages are asked together (document_ids: over gRPC through CompressQueries), each
    line's requests to one target: the same output lines however the job runs."""
    from ilre.evaluation.tasks.haystack import pydoc_text

    from tests.cli.test_batch_job import chat_line

    text = pydoc_text()
    chats = []
    for i in range(4):
        chat = chat_line(f"chat-{i}", text[i * 5000:i * 5000 + 4000] + f"\nThe audit code is {7100 + i}.\n",
                         "What is the audit code?")
        chat["body"]["messages"].insert(1, {"role": "user", "content": text[50000 + i * 3000:50000 + i * 3000 + 2500]})
        chats.append(chat)
    source = write_lines(tmp_path / "chats.jsonl", chats)
    common = ["--ratio", "0.3", "--in-flight", "4"]
    runs = {"process": [], "http": ["--server", f"http://127.0.0.1:{local_service.http_port}"],
            "grpc": ["--server", f"127.0.0.1:{local_service.grpc_port}"],
            "both": ["--server", f"http://127.0.0.1:{local_service.http_port}", "--server",
                     f"127.0.0.1:{local_service.grpc_port}"],
            "redis": ["--redis-url", redis_server.url, "--redis-prefix", "batch-openai"]}
    outputs = {}
    config = service_config(redis_url=redis_server.url, redis_prefix="batch-openai", redis_retry_s=1.0)
    with WorkerThread(engine, config, name="openai-worker"):
        for name, where in runs.items():
            output = tmp_path / f"{name}.jsonl"
            proc = batch("--input", str(source), "--output", str(output), *common, *where)
            assert proc.returncode == 0, (name, proc.stderr.decode())
            outputs[name] = read_lines(output)
    first = outputs["process"]
    assert [line["custom_id"] for line in first] == [f"chat-{i}" for i in range(4)]
    assert all(line["body"] != chat["body"] for line, chat in zip(first, chats))  # compressed
    for name, lines in outputs.items():
        assert lines == first, name
