"""The LiteLLM proxy hook as a gateway runs it: LiteLLM's real proxy (its own environment with the thin
ilre client, `make litellm`, built by `make test`) in front of llama.cpp's server (a 4096-token window),
compressing through a real `ilre serve` on loopback, by tokens and by whole lines; then the same with ilre
stopped (fail-open) and in strict mode."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from ilre.evaluation.tasks.haystack import shakespeare_text

from tests.service.conftest import free_port, lines_context, served_by, wait_for
from tests.service.engines import LlamaServer, RecordingRelay

REPO = Path(__file__).resolve().parents[2]
ANSWER = "The vault code of the museum is 4471."
QUESTION = "What is the vault code of the museum? Answer with the code."


def litellm_binary() -> Path:
    return Path(os.environ.get("ILRE_LITELLM_BIN") or REPO / ".venv-litellm" / "bin" / "litellm")


HOOK = """litellm_settings:
  callbacks: ilre.integrations.litellm.compression
"""


class Proxy:
    """`litellm --config` on a free port: one model (the llama-server, or a relay in front of it) and
    `plugs`, the rest of config.yaml (default: the ilre hook, with its settings from the environment)."""

    def __init__(self, engine: LlamaServer | RecordingRelay, tmp_path: Path, plugs: str = HOOK,
                 args: tuple[str, ...] = (), wait: bool = True, guardrails: dict[str, str] | None = None,
                 **settings: str):
        """`guardrails`: model name -> the guardrail that model runs (LiteLLM's model-level guardrails), one
        model per entry; without it, one model, "smollm"."""
        binary = litellm_binary()
        if not binary.is_file():
            pytest.fail(f"LiteLLM's proxy not found at {binary}: run `make litellm` (make test does)")
        config = tmp_path / f"config-{len(list(tmp_path.glob('config-*')))}.yaml"
        models = "".join(f"""  - model_name: {name}
    litellm_params:
      model: openai/smollm
      api_base: {engine.url}/v1
      api_key: none
""" + (f"      guardrails: [{guardrail}]\n" if guardrail else "") for name, guardrail in (guardrails or {"smollm": ""}).items())
        config.write_text("model_list:\n" + models + plugs)
        self.port = free_port()
        self.log = tmp_path / f"proxy-{self.port}.log"
        self.key = "sk-" + secrets.token_hex(24)  # the proxy refuses to start without a master key
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False",
               "LITELLM_MASTER_KEY": self.key,
               **{f"ILRE_LITELLM_{k.upper()}": v for k, v in settings.items()}}
        self.proc = subprocess.Popen([str(binary), "--config", str(config), "--host", "127.0.0.1", "--port",
                                      str(self.port), *args], env=env, stdout=self.log.open("wb"), stderr=subprocess.STDOUT,
                                     cwd=tmp_path)
        if wait:
            self.ready()

    def ready(self) -> "Proxy":
        """Wait until the proxy answers (started with wait=False: several start at once)."""
        wait_for(self._live, 240, "LiteLLM's proxy to start", interval=0.5)
        return self

    def _live(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"litellm exited with {self.proc.returncode}: {self.log.read_text()[-3000:]}")
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/health/liveliness", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def chat(self, messages: list[dict], max_tokens: int = 8, model: str = "smollm") -> httpx.Response:
        return httpx.post(f"http://127.0.0.1:{self.port}/v1/chat/completions", timeout=600,
                          headers={"authorization": f"Bearer {self.key}"},
                          json={"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0})

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def document(chars: int) -> str:
    text = shakespeare_text()[:chars]
    return text[:chars // 2] + " " + ANSWER + " " + text[chars // 2:]


def chat_of(chars: int) -> list[dict]:
    return [{"role": "system", "content": "You answer from the document."},
            {"role": "user", "content": document(chars) + "\n\n" + QUESTION}]


def direct(engine: LlamaServer, messages: list[dict]) -> httpx.Response:
    return httpx.post(f"{engine.url}/v1/chat/completions", timeout=600,
                      json={"messages": messages, "max_tokens": 8, "temperature": 0})


@pytest.fixture(scope="module")
def engine():
    server = LlamaServer(4096)
    yield server
    server.stop()


def test_long_chat_is_answered_whole_lines_kept_and_with_ilre_stopped_fails_open_or_strict_refuses(engine, tmp_path):
    """Through the proxy: a chat the engine refuses whole is compressed and answered, a short one passes through; a
    second proxy (strict, granularity unit) keeps whole lines of each compressed message; then ilre stops: the
    default hook lets the call go on uncompressed, the strict one refuses it (the two proxies started at once: one
    LiteLLM start is ~17 s of CPU)."""
    long = chat_of(20000)  # ~5K tokens
    refused = direct(engine, long)
    assert refused.status_code == 400 and "context" in refused.text  # the engine cannot take it whole
    middle = chat_of(8000)  # ~2K tokens: above the budget, within the engine's window
    relay = RecordingRelay(engine.port)  # what the engine received from the strict proxy
    proxies: list[Proxy] = []
    try:
        with served_by("--budget", "1024") as served:
            proxies += [Proxy(engine, tmp_path, target=served.grpc, budget="1024", timeout_s="120", wait=False),  # the default 30 s is short on a loaded 2-core machine
                        Proxy(relay, tmp_path, target=served.grpc, budget="200", granularity="unit", strict="1",
                              timeout_s="120", wait=False)]
            proxy, strict = (p.ready() for p in proxies)  # started together
            answer = proxy.chat(long)
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-ilre-action"] == "compressed"
            original, kept = int(answer.headers["x-ilre-original-tokens"]), int(answer.headers["x-ilre-compressed-tokens"])
            assert original > engine.ctx_size and kept <= 1024 + 64
            usage = answer.json()["usage"]["prompt_tokens"]
            assert kept <= usage <= kept + 64, (usage, kept)  # the engine saw the compressed prompt (plus its chat template)

            short = [{"role": "user", "content": "Say hello."}]
            untouched = proxy.chat(short)
            assert untouched.status_code == 200 and untouched.headers["x-ilre-action"] == "passthrough"
            assert untouched.headers["x-ilre-reason"] == "fits the budget"
            assert untouched.json()["usage"]["prompt_tokens"] == direct(engine, short).json()["usage"]["prompt_tokens"]
            assert_whole_lines_kept(strict, relay)
        answer = proxy.chat(middle)  # ilre is gone: the call goes on uncompressed
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-ilre-action"] == "failed" and "UNAVAILABLE" in answer.headers["x-ilre-reason"]
        assert answer.json()["usage"]["prompt_tokens"] == direct(engine, middle).json()["usage"]["prompt_tokens"]
        assert "compression failed, the call goes on uncompressed" in proxy.log.read_text()

        refused = strict.chat(middle)
        assert refused.status_code == 503, refused.text
        assert "ilre: compression failed" in refused.text and "UNAVAILABLE" in refused.text
    finally:
        for proxy in proxies:
            proxy.stop()
        relay.close()


def assert_whole_lines_kept(proxy: Proxy, relay: RecordingRelay) -> None:
    """Granularity unit (the proxy's hook at budget 200): each compressed message keeps whole lines."""
    text = lines_context(300)  # ~5K tokens
    messages = [{"role": "user", "content": text}, {"role": "assistant", "content": "Noted."},
                {"role": "user", "content": "What is the value of item 17?"}]
    answer = proxy.chat(messages)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-ilre-action"] == "compressed"
    sent = relay.last("/v1/chat/completions").json()["messages"]
    assert sent[1:] == messages[1:]
    kept, whole = sent[0]["content"].split("\n"), set(text.split("\n"))
    assert len(kept) > 5 and len(sent[0]["content"]) < len(text) / 10
    assert len([line for line in kept[1:] if line not in whole]) <= 1, kept  # but the sink and one cut to fit


def test_a_granularity_ilre_does_not_offer_is_refused_by_name():
    python = litellm_binary().parent / "python"
    if not python.is_file():
        pytest.fail(f"LiteLLM's environment not found at {python.parent}: run `make litellm` (make test does)")
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False"}
    code = """import os
try:
    import ilre.integrations.litellm  # the hook's settings are read as LiteLLM loads it
except ValueError as exc:
    print(exc)
del os.environ["ILRE_LITELLM_GRANULARITY"]
from ilre.integrations.litellm import IlreCompression
IlreCompression(granularity="lines")  # and given in code
"""
    proc = subprocess.run([str(python), "-c", code], env={**env, "ILRE_LITELLM_GRANULARITY": "sentence"},
                          capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip() == "ILRE_LITELLM_GRANULARITY: granularity: must be one of token, unit (got 'sentence')", proc
    assert proc.returncode != 0 and "ValueError: granularity: must be one of token, unit (got 'lines')" in proc.stderr, proc
