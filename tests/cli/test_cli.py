"""The `ilre` CLI as a user runs it: a real process, the embedded model, the JSON contract. The error messages
of many bad inputs are checked in this process (`cli`: `main()` as the console script calls it), one of
them also through a real process."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.service.conftest import LINES_QUERY, assert_whole_lines, lines_context

ILRE = [sys.executable, "-m", "ilre.cli"]
CONTRACT = {"id", "token_ids", "kept_indices", "compressed_context", "query", "original_tokens",
            "compressed_tokens", "ratio", "model", "layer", "strategy", "timings_ms"}
FACT = "The vault code of the museum is 4471. "
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
CONTEXT = FILLER * 30 + FACT + FILLER * 30
QUERY = " What is the vault code of the museum? The vault code is"


def run(*args: str, stdin: bytes | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*ILRE, *args], input=stdin, capture_output=True, timeout=300,
                          env={**os.environ, **(env or {})})


@pytest.fixture
def cli(monkeypatch, capsys):
    """`ilre ARGS` run in this process by `main()`, the console script's call: (exit status, stderr)."""
    from ilre.cli.main import main

    def call(*args: str, stdin: bytes | None = None, env: dict | None = None) -> tuple[int, str]:
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        capsys.readouterr()
        try:
            status = main(list(args))
        except SystemExit as exc:  # argparse's usage errors
            status = exc.code
        return status, capsys.readouterr().err

    return call


def test_compress_json_has_contract_fields_and_consistent_ids(tmp_path: Path):
    proc = run("compress", "--context", CONTEXT, "--query", QUERY, "--budget", "200", "--json")
    assert proc.returncode == 0, proc.stderr.decode()
    result = json.loads(proc.stdout)
    assert CONTRACT <= set(result)
    assert result["compressed_tokens"] == len(result["kept_indices"]) == 200
    assert result["original_tokens"] > 1000
    assert result["kept_indices"] == sorted(set(result["kept_indices"]))
    assert result["kept_indices"][:4] == [0, 1, 2, 3]  # the sink
    assert len(result["token_ids"]) > result["compressed_tokens"]  # query ids appended
    assert result["ratio"] == pytest.approx(200 / result["original_tokens"], abs=1e-5)
    assert result["strategy"] == "cascade" and result["model"] == "SmolLM2-135M-Instruct"  # the default
    assert {"prefill", "score", "allocate", "total"} <= set(result["timings_ms"])
    assert "4471" in result["compressed_context"]


def test_compress_text_output_and_stdin(tmp_path: Path):
    proc = run("compress", "--context-file", "-", "--query", QUERY, "--ratio", "0.1", stdin=CONTEXT.encode())
    assert proc.returncode == 0, proc.stderr.decode()
    assert "kept" in proc.stderr.decode() and "context tokens" in proc.stderr.decode()
    assert 0 < len(proc.stdout) < len(CONTEXT)


def test_passthrough_when_context_fits():
    proc = run("compress", "--context", "short text", "--query", "q?", "--json", "--strategy", "streaming_llm")
    result = json.loads(proc.stdout)
    assert result["passthrough"] is True and result["compressed_context"] == "short text"


@pytest.mark.parametrize(
    "args, stdin, message",
    [
        (["--context", ""], None, "context: must not be empty"),
        (["--context", "abc", "--budget", "0"], None, "budget: must be a positive integer"),
        (["--context", "abc", "--budget", "-5"], None, "budget: must be a positive integer"),
        (["--context", "abc", "--ratio", "1.5"], None, "ratio: must be a number in (0, 1]"),
        (["--context", "abc", "--strategy", "magic"], None, "strategy: unknown strategy 'magic'"),
        (["--context-file", "/no/such/file"], None, "context-file: no such file"),
        (["--context-file", "-"], b"ok \xff\xfe bytes", "context-file: not valid UTF-8"),
        (["--context", "word " * 50, "--max-context-tokens", "10"], None,
         "tokens exceed the limit of 10 (max_context_tokens)"),
        (["--context", "abc", "--layer", "99"], None, "layer: must be in 1..30"),
        (["--context", "abc", "--model", "/no/such/dir"], None, "model:"),
        (["--context", "abc", "--dtype", "int4"], None, "dtype: 'int4' is not one of auto, float32, bfloat16, float16, int8"),
        (["--context", "abc", "--device", "tpu"], None, "device: 'tpu' is not one of auto, cpu, cuda"),
        (["--context", "abc", "--device", "npu:0"], None, "device: npu needs the torch_npu package"),
        (["--context", "abc", "--device", "cuda:0"], None, "device: 'cuda:0' asked for, but"),
        (["--context", "abc", "--granularity", "sentence"], None,
         "argument --granularity: must be one of token, unit (got 'sentence')"),
    ],
)
def test_bad_input_names_field_without_traceback(args, stdin, message, cli):
    status, err = cli("compress", "--query", "q", *args, stdin=stdin)
    assert status == 2, err
    assert message in err
    assert "Traceback" not in err


def test_a_real_process_prints_the_same_one_line():
    proc = run("compress", "--query", "q", "--context", "abc", "--ratio", "1.5")
    assert proc.returncode == 2 and proc.stderr.decode().strip() == "error: ratio: must be a number in (0, 1] (got 1.5)"


@pytest.mark.parametrize("command", [["serve", "--grpc-port", "0", "--http-port", "0"],
                                     ["sidecar", "--port", "0"], ["worker", "--redis-url", "redis://127.0.0.1:1"],
                                     ["calibrate", "--quick"], ["eval", "--quick"]])
def test_every_model_command_checks_device_and_dtype(command, cli):
    status, err = cli(*command, "--device", "npu", env={"ILRE_DTYPE": "float32"})
    assert status == 2 and "device: npu needs the torch_npu package" in err and "Traceback" not in err
    status, err = cli(*command, env={"ILRE_DTYPE": "double"})  # the environment variable is read too
    assert status == 2 and "dtype: 'double' is not one of" in err, err


@pytest.mark.parametrize("command", [["serve", "--grpc-port", "0", "--http-port", "0"], ["sidecar", "--port", "0"],
                                     ["worker", "--redis-url", "redis://127.0.0.1:1"],
                                     ["batch", "--input", "-", "--output", "-"]])
def test_every_server_and_batch_checks_deepen(command, cli):
    status, err = cli(*command, env={"ILRE_DEEPEN": "always"})
    assert status == 2 and "deepen: must be one of idle, hold, off (got 'always'; env ILRE_DEEPEN)" in err, err
    assert "Traceback" not in err
    status, err = cli(*command, "--deepen", "later")
    assert status == 2 and "argument --deepen: must be one of idle, hold, off (got 'later')" in err


def test_batch_keeps_going_past_bad_lines(tmp_path: Path):
    lines = [
        json.dumps({"id": "a", "context": CONTEXT, "query": QUERY, "budget": 128}),
        "{not json",
        json.dumps({"id": "b", "context": "", "query": QUERY}),
        json.dumps({"id": "c", "context": CONTEXT, "query": QUERY, "strategy": "streaming_llm"}),
        json.dumps({"id": "d", "context": CONTEXT, "query": QUERY, "budget": 0}),
        json.dumps({"id": "e", "context": CONTEXT, "query": QUERY, "colour": "red"}),
    ]
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_bytes(("\n".join(lines) + "\n").encode() + b'{"id": "f", "context": "\xff", "query": "q"}\n')
    proc = run("batch", "--input", str(source), "--output", str(target), "--ratio", "0.25")
    assert proc.returncode == 0, proc.stderr.decode()
    out = [json.loads(line) for line in target.read_text().splitlines()]
    assert [o.get("id") for o in out] == ["a", None, "b", "c", "d", "e", None]
    assert out[0]["compressed_tokens"] == 128 and CONTRACT <= set(out[0])
    assert "not valid JSON" in out[1]["error"]
    assert out[2]["error"].startswith("context: must not be empty")
    assert out[3]["strategy"] == "streaming_llm"
    assert out[3]["compressed_tokens"] == -(-out[3]["original_tokens"] // 4)  # the default ratio applied
    assert out[4]["error"].startswith("budget:")
    assert out[5]["error"].startswith("colour: unknown field")
    assert "not valid UTF-8" in out[6]["error"]
    assert "5 compressed" not in proc.stderr.decode() and "2 compressed, 5 failed" in proc.stderr.decode()


def test_granularity_unit_keeps_whole_lines_in_compress_and_batch(tmp_path: Path):
    text = lines_context()
    proc = run("compress", "--context", text, "--query", LINES_QUERY, "--budget", "60", "--granularity", "unit",
               "--json")
    assert proc.returncode == 0, proc.stderr.decode()
    single = json.loads(proc.stdout)
    assert single["granularity"] == "unit" and single["compressed_tokens"] == 60
    assert_whole_lines(text, single["kept_spans"])

    lines = [json.dumps({"id": "default", "context": text, "query": LINES_QUERY}),  # --granularity unit applies
             json.dumps({"id": "token", "context": text, "query": LINES_QUERY, "granularity": "token"}),
             json.dumps({"id": "bad", "context": text, "query": LINES_QUERY, "granularity": "sentence"})]
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join(lines) + "\n")
    proc = run("batch", "--input", str(source), "--output", str(target), "--budget", "60", "--granularity", "unit")
    assert proc.returncode == 0, proc.stderr.decode()
    out = [json.loads(line) for line in target.read_text().splitlines()]
    assert {k: v for k, v in out[0].items() if k not in ("id", "timings_ms", "document_id")} == \
        {k: v for k, v in single.items() if k not in ("id", "timings_ms", "document_id")}
    assert out[1]["granularity"] == "token" and "kept_spans" not in out[1]
    assert out[2] == {"id": "bad", "error": "granularity: must be one of token, unit (got 'sentence')"}
    proc = run("compress", "--context", text, "--query", LINES_QUERY, env={"ILRE_GRANULARITY": "sentence"})
    assert proc.returncode == 2 and ("granularity: must be one of token, unit (got 'sentence'; env ILRE_GRANULARITY)"
                                     in proc.stderr.decode())


def test_batch_missing_input_is_a_clear_failure(tmp_path: Path):
    proc = run("batch", "--input", str(tmp_path / "absent.jsonl"), "--output", str(tmp_path / "o.jsonl"))
    assert proc.returncode == 2
    assert "input: cannot read" in proc.stderr.decode() and "Traceback" not in proc.stderr.decode()


def test_engine_rejects_ids_beyond_int64(engine):
    from ilre.contract.messages import CompressRequest, InputError

    for bad in (2**70, -1, 49152):
        with pytest.raises(InputError, match=f"context_ids: token id {bad} outside the vocabulary 0..49151"):
            engine.compress(CompressRequest(context_ids=[1, 2, bad], query="q"))


@pytest.mark.parametrize("argv, missing", [(["eval", "--quick"], "bm25s"), (["calibrate", "--quick"], "matplotlib"),
                                           (["train-locret", "--layer", "8"], "wonderwords")])
def test_evaluation_commands_name_the_missing_extra(monkeypatch, capsys, argv, missing):
    import importlib.util

    from ilre.cli.main import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == missing else real(name, *a))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"needs the `eval` extra (missing: {missing}): pip install 'ilre[eval]'" in err and "Traceback" not in err


def test_deepening_is_on_by_default_for_every_server_and_batch_holds_streams():
    from ilre.cli.parser import build_parser

    env = {k: v for k, v in os.environ.items() if k != "ILRE_DEEPEN"}
    script = ("from ilre.cli.parser import build_parser; p = build_parser(); "
              "print([p.parse_args(a).deepen for a in (['serve'], ['worker'], ['sidecar'], "
              "['batch', '--input', 'x', '--output', 'y'])])")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    # the sidecar's: a chat one turn longer; a batch job's: no idle moment to deepen in, a grown line from the stream
    assert out.stdout.strip() == "['idle', 'idle', 'idle', 'hold']", out.stderr
    assert build_parser().parse_args(["sidecar", "--deepen", "off"]).deepen == "off"  # takes its deepened prefix on
