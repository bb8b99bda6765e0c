"""The OpenAI batch path end to end: a batch file of chat requests whose tool results and documents exceed the
engine's window, through `ilre batch`, then `vllm run-batch` (the suite's vLLM, a 4096-token window) on what it
wrote: every compressed line answered, each prompt within the budget plus what stays whole, the planted fact in the
prompt the engine got; the same requests straight to `vllm run-batch` fail over the window. One run of vLLM reads
both (and a copy of each request with its long messages emptied, which measures what stays whole)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ilre.evaluation.tasks.haystack import pydoc_text, shakespeare_text
from tests.service.engines import engine_dtype, engine_python, engine_threads, smollm2_folder, VLLM_VERSION

pytestmark = pytest.mark.slow

WINDOW, BUDGET = 4096, 1024
FACTS = ["The audit code of the report is 5521.", "The vault code of the museum is 8804."]


def requests() -> list[dict]:
    """Two agent steps over the window: a ~6K-token tool result, and a ~6K-token document the user pasted."""
    code, play = pydoc_text()[:26000], shakespeare_text()[50000:76000]
    tool = f"{code[:11000]}\n{FACTS[0]}\n{code[11000:]}"
    document = f"{play[:15000]}\n{FACTS[1]}\n{play[15000:]}"
    call = {"id": "call_1", "type": "function", "function": {"name": "read_report", "arguments": "{}"}}
    steps = {
        "tool": [{"role": "system", "content": "Answer from the tool's results."},
                 {"role": "user", "content": "Read the report."},
                 {"role": "assistant", "content": None, "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": "call_1", "content": tool},
                 {"role": "user", "content": "What is the audit code of the report?"}],
        "document": [{"role": "user", "content": f"Here is a text:\n{document}"},
                     {"role": "assistant", "content": "I have read it."},
                     {"role": "user", "content": "What is the vault code of the museum?"}]}
    return [{"custom_id": name, "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "smollm2", "messages": messages, "max_tokens": 8, "temperature": 0}}
            for name, messages in steps.items()]


def emptied(line: dict) -> dict:
    """The same request with its long messages emptied: what stays whole (instructions, calls, the question)."""
    messages = [{**m, "content": ""} if isinstance(m.get("content"), str) and len(m["content"]) > 2000 else m
                for m in line["body"]["messages"]]
    return {**line, "custom_id": line["custom_id"] + "/rest", "body": {**line["body"], "messages": messages}}


def run_batch_on_vllm(source: Path, target: Path) -> list[dict]:
    command = [str(engine_python("vllm", VLLM_VERSION)), "-m", "vllm.entrypoints.openai.run_batch", "-i", str(source),
               "-o", str(target), "--model", str(smollm2_folder()), "--served-model-name", "smollm2",
               "--max-model-len", str(WINDOW), "--dtype", engine_dtype(), "--enforce-eager"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": str(engine_threads())}
    proc = subprocess.run(command, capture_output=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    return [json.loads(line) for line in target.read_text().splitlines()]


def test_a_compressed_batch_file_runs_on_vllm_run_batch_and_the_original_does_not(tmp_path):
    lines = requests()
    source = tmp_path / "requests.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    compressed = tmp_path / "compressed.jsonl"
    proc = subprocess.run([sys.executable, "-m", "ilre.cli", "batch", "--input", str(source), "--output",
                           str(compressed), "--budget", str(BUDGET), "--json"], capture_output=True, timeout=900)
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(proc.stdout.decode().splitlines()[-1])["errors"] == 0
    shortened = [json.loads(line) for line in compressed.read_text().splitlines()]
    assert [s["custom_id"] for s in shortened] == ["tool", "document"]
    assert FACTS[0] in shortened[0]["body"]["messages"][3]["content"]
    assert FACTS[1] in shortened[1]["body"]["messages"][0]["content"]

    raw = [{**line, "custom_id": line["custom_id"] + "/whole"} for line in lines]
    both = tmp_path / "both.jsonl"
    both.write_text("".join(json.dumps(line) + "\n" for line in shortened + raw + [emptied(l) for l in lines]))
    answers = {a["custom_id"]: a for a in run_batch_on_vllm(both, tmp_path / "answers.jsonl")}
    for name in ("tool", "document"):
        answer = answers[name]["response"]
        assert answer["status_code"] == 200, answers[name]
        usage, rest = answer["body"]["usage"], answers[name + "/rest"]["response"]["body"]["usage"]
        assert usage["prompt_tokens"] <= BUDGET + rest["prompt_tokens"], (usage, rest)
        whole = answers[name + "/whole"]
        failed = whole["error"] is not None or whole["response"]["status_code"] != 200
        said = json.dumps(whole).lower()
        assert failed and ("context length" in said or "maximum" in said), whole  # over the window
