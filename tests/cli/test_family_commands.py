"""Decoder families as a user meets them: `ilre compress`, `ilre serve` and `ilre batch` with `--model` on tiny random
checkpoints (tests/family_models.py), among them families this project names nowhere (a dense, a MoE and a hybrid
one with convolution layers): each reply keeps the budget and gives back the checkpoint's own tokenizer's ids."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.family_models import _COMMON, L_R, byte_tokenizer, family_checkpoint
from tests.service.conftest import served_by

pytestmark = pytest.mark.xdist_group("families")

# families ilre names nowhere: dense, MoE, and a hybrid whose other layers are short convolutions
UNNAMED = {"olmo2": {}, "granitemoe": dict(num_local_experts=4, num_experts_per_tok=2),
           "lfm2": dict(layer_types=["conv"] * 3 + ["full_attention", "conv", "full_attention"])}
QUERY = "What is key5?"
BUDGET = 64


def _context(lines: int = 40, shift: int = 0) -> str:
    return " ".join(f"Line {i}: the value of key{i} is {i * 7 + shift}." for i in range(lines))


def _checkpoint(family: str, tmp_path: Path) -> Path:
    if family not in UNNAMED:
        return family_checkpoint(family)
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = tmp_path / family
    config = AutoConfig.for_model(family, **{**_COMMON, **UNNAMED[family]})
    AutoModelForCausalLM.from_config(config).save_pretrained(str(folder))
    byte_tokenizer().save_pretrained(str(folder))
    return folder


def _assert_own_ids(result: dict, context: str) -> None:
    """The reply keeps BUDGET tokens of `context` and gives their ids, then the query's, in the byte tokenizer."""
    ids = byte_tokenizer()(context, add_special_tokens=False).input_ids
    query = byte_tokenizer()(QUERY, add_special_tokens=False).input_ids
    assert len(result["kept_indices"]) == BUDGET
    assert result["token_ids"] == [ids[i] for i in result["kept_indices"]] + query  # the kept context, the query


@pytest.mark.parametrize("family", [*UNNAMED, "gpt_oss", "qwen3_5_text"])
def test_compress_command_on_a_family_keeps_its_tokenizers_ids(family, tmp_path):
    folder = _checkpoint(family, tmp_path)
    (tmp_path / "context.txt").write_text(_context())
    done = subprocess.run([sys.executable, "-m", "ilre.cli", "compress", "--model", str(folder), "--layer", str(L_R),
                           "--budget", str(BUDGET), "--granularity", "token", "--query", QUERY, "--json",
                           "--context-file", str(tmp_path / "context.txt")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    _assert_own_ids(result, _context())
    assert result["layer"] == L_R


@pytest.mark.parametrize("family", UNNAMED)
def test_serve_on_a_family_answers_over_http_with_its_tokenizers_ids(family, tmp_path):
    folder = _checkpoint(family, tmp_path)
    with served_by("--model", str(folder), "--layer", str(L_R), "--granularity", "token") as served:
        reply = httpx.post(f"{served.http}/v1/compress", json={"context": _context(), "query": QUERY,
                                                               "budget": BUDGET}, timeout=120)
        info = httpx.get(f"{served.http}/v1/model", timeout=30)
    assert reply.status_code == 200, reply.text
    _assert_own_ids(reply.json(), _context())
    assert info.status_code == 200 and info.json()["num_layers"] == 6, info.text


@pytest.mark.parametrize("family", UNNAMED)
def test_batch_on_a_family_writes_each_line_with_its_tokenizers_ids(family, tmp_path):
    folder = _checkpoint(family, tmp_path)
    contexts = [_context(40, shift) for shift in range(3)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": f"r{i}", "context": c, "query": QUERY}) + "\n"
                                               for i, c in enumerate(contexts)))
    done = subprocess.run([sys.executable, "-m", "ilre.cli", "batch", "--model", str(folder), "--layer", str(L_R),
                           "--budget", str(BUDGET), "--granularity", "token", "--input", str(tmp_path / "in.jsonl"),
                           "--output", str(tmp_path / "out.jsonl")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [line["id"] for line in lines] == ["r0", "r1", "r2"]
    for line, context in zip(lines, contexts):
        _assert_own_ids(line, context)
