"""A sibling scorer: the sidecar compresses with a small checkpoint in front of a real vLLM serving a larger one.
Where the two share a tokenizer (both made with the byte tokenizer of tests/family_models.py, another family and size)
the engine gets the compressed prompt as token IDs; where they do not (the embedded SmolLM2 scoring), it gets text,
and the reply and /ilre/readyz say why. The check is the tokenizers' own: a probe text tokenized by both."""

from __future__ import annotations

import httpx
import pytest

from ilre.engine.engine import Engine, EngineConfig
from ilre.service.common.config import SidecarConfig
from ilre.service.server import ServiceThread
from tests.family_models import _COMMON, byte_tokenizer

from .conftest import service_config
from .engines import RecordingRelay, VllmServer

pytestmark = pytest.mark.slow

# the engine's model: a Llama of 8 layers, head width 64 (vLLM's CPU attention takes it); the sibling: a Qwen3 of
# 4 layers, half as wide; both with the byte tokenizer
TARGET = dict(num_hidden_layers=8, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
              intermediate_size=512)
SIBLING = dict(num_hidden_layers=4, hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
               intermediate_size=256)
BUDGET = 96


def _checkpoint(folder, family: str, shape: dict):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(family, **{**_COMMON, "max_position_embeddings": 2048, **shape})
    AutoModelForCausalLM.from_config(config).save_pretrained(str(folder))
    byte_tokenizer().save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    folder = _checkpoint(tmp_path_factory.mktemp("target"), "llama", TARGET)
    server = VllmServer(2048, model=folder, served_name="target").start()
    relay = RecordingRelay(server.port)
    yield relay
    relay.close()
    server.stop()


def _prompt() -> str:
    lines = " ".join(f"Record {i}: the harbour code is {1000 + 37 * i}." for i in range(30))
    return f"{lines}\nQuestion: what is the harbour code of record 7? Answer:"


def _ask(engine: Engine, relay: RecordingRelay) -> tuple[httpx.Response, dict, dict]:
    """One completion through a sidecar scoring with `engine`: the reply, what the engine got, /ilre/readyz."""
    config = SidecarConfig(engine_url=relay.url, engine_api="openai", engine_health_interval_s=0.5)
    with ServiceThread(service_config(), engine, sidecar=config, tokenizer=engine.tokenizer) as svc, \
            httpx.Client(base_url=f"http://127.0.0.1:{svc.http_port}", timeout=300) as client:
        reply = client.post("/v1/completions", json={"model": "target", "prompt": _prompt(), "max_tokens": 4,
                                                     "temperature": 0}, headers={"x-ilre-budget": str(BUDGET)})
        ready = client.get("/ilre/readyz").json()
    return reply, relay.last("/v1/completions").json(), ready


def test_a_sibling_sharing_the_tokenizer_sends_token_ids(target, tmp_path):
    sibling = Engine(EngineConfig(model=str(_checkpoint(tmp_path / "sibling", "qwen3", SIBLING)), layer=3))
    reply, sent, ready = _ask(sibling, target)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-ilre-action"] == "compressed" and "x-ilre-reason" not in reply.headers
    assert reply.json()["usage"]["prompt_tokens"] == int(reply.headers["x-ilre-compressed-tokens"])
    ids = sent["prompt"]
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    assert byte_tokenizer().decode(ids).endswith("Answer:")  # the query, kept whole after the kept context
    assert len(ids) < len(byte_tokenizer()(_prompt()).input_ids)
    assert ready["engine"]["forward"] == "ids" and "gives the compressor's token IDs" in ready["engine"]["forward_reason"]


def test_a_scorer_with_another_tokenizer_sends_text_and_says_why(target):
    other = Engine(EngineConfig())  # the embedded SmolLM2: its own tokenizer
    reply, sent, ready = _ask(other, target)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-ilre-action"] == "compressed"
    assert "tokenizer differs" in reply.headers["x-ilre-reason"]
    assert isinstance(sent["prompt"], str) and sent["prompt"].endswith("Answer:")
    assert len(sent["prompt"]) < len(_prompt())
    assert ready["engine"]["forward"] == "text" and "differs" in ready["engine"]["forward_reason"]
