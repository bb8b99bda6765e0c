"""End-to-end latency of long prompts through the sidecar vs straight to the engine.

One llama-server (the embedded SmolLM2 GGUF, built by `make engine`) with a window large enough to
take the full prompts (beyond the model's 8K training window: the timing is what is measured here),
and the sidecar in front of it in this process. For each length, a streamed /completion request
(greedy, 16 new tokens, no prompt cache) is sent both ways; printed: time to first token, total,
prompt tokens the engine evaluated, and the compression time the sidecar reports.

    .venv/bin/python bench/sidecar_bench.py [--lengths 16000,32000] [--budget 1024]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ilre.engine.engine import Engine  # noqa: E402
from ilre.evaluation.haystack import filler_ids  # noqa: E402
from ilre.service.config import ServiceConfig, SidecarConfig  # noqa: E402
from ilre.service.server import ServiceThread  # noqa: E402
from tests.service.engines import LlamaServer  # noqa: E402

FACT = "\n\nThe vault code of the Duke of Milan's museum is 7302946.\n\n"
QUESTION = ("\n\nQuestion: What is the vault code of the Duke of Milan's museum?\n"
            "Answer: The vault code of the Duke of Milan's museum is")


def timed_stream(url: str, body: dict, headers: dict | None = None) -> dict:
    """Send a streamed completion; time to the first content event and to the end."""
    start = time.perf_counter()
    first, text, evaluated, reply_headers = None, "", None, {}
    with httpx.stream("POST", url, json=body, headers=headers or {}, timeout=1800) as reply:
        if reply.status_code != 200:
            raise SystemExit(f"{url}: {reply.status_code} {reply.read().decode()[:300]}")
        reply_headers = reply.headers
        for line in reply.iter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if event.get("content") and first is None:
                first = time.perf_counter() - start
            text += event.get("content", "")
            evaluated = event.get("tokens_evaluated", evaluated) or (event.get("timings") or {}).get("prompt_n", evaluated)
    return {"ttft": first, "total": time.perf_counter() - start, "text": text, "evaluated": evaluated,
            "compress_ms": reply_headers.get("x-ilre-compress-ms"), "forwarded": reply_headers.get("x-ilre-compressed-tokens"),
            "original": reply_headers.get("x-ilre-original-tokens")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="16000,32000", help="prompt lengths in tokens")
    parser.add_argument("--budget", type=int, default=1024)
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    engine = Engine()
    tok = engine.tokenizer
    window = max(lengths) + 4096  # past the model's 8K training window: for the straight-path timing only
    llama = LlamaServer(window, 2, "--override-kv", f"llama.context_length=int:{window}")
    sidecar = SidecarConfig(engine_url=llama.url, engine_api="llamacpp")
    config = ServiceConfig(host="127.0.0.1", grpc_port=0, http_port=0)
    rows = []
    try:
        with ServiceThread(config, engine, sidecar=sidecar, tokenizer=tok) as svc:
            via = f"http://127.0.0.1:{svc.http_port}/completion"
            for n in lengths:
                filler = tok.decode(filler_ids(tok, n))
                at = filler.rfind("\n", 0, int(len(filler) * 0.4)) + 1
                prompt = filler[:at] + FACT + filler[at:] + QUESTION
                body = {"prompt": prompt, "n_predict": 16, "temperature": 0, "stream": True, "cache_prompt": False}
                direct = timed_stream(llama.url + "/completion", body)
                through = timed_stream(via, body, {"x-ilre-budget": str(args.budget)})
                rows.append((n, len(tok(prompt).input_ids), direct, through))
    finally:
        llama.stop()
    print(f"\nsidecar in front of llama-server (SmolLM2-135M Q4_1 GGUF, window raised to {window} tokens, past the "
          f"model's 8K: straight-path answers are not meaningful there), budget {args.budget}, 16 new tokens, "
          "streamed, no prompt cache")
    print(f"| {'prompt tokens':>13} | {'path':<22} | {'forwarded':>9} | {'compress s':>10} | {'TTFT s':>7} | {'total s':>7} | answer")
    for n, tokens, direct, through in rows:
        for name, r in (("straight to the engine", direct), ("through the sidecar", through)):
            forwarded = r["forwarded"] or r["evaluated"] or tokens
            compress = f"{float(r['compress_ms']) / 1000:.2f}" if r["compress_ms"] else "-"
            print(f"| {tokens:>13} | {name:<22} | {forwarded:>9} | {compress:>10} | {r['ttft']:>7.2f} | "
                  f"{r['total']:>7.2f} | {'7302946' in r['text']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
