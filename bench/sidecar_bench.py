"""End-to-end latency of long prompts through the sidecar vs straight to the engine, for each engine.

Engines (built or installed by `make engine`, each serving the embedded SmolLM2): llama.cpp's
`llama-server` (the Q4_1 GGUF, `/completion`), vLLM's OpenAI server and SGLang's server (bfloat16,
`/v1/completions`), one at a time, each with a window large enough for the full prompts (beyond the
model's 8K training window: the timing is what is measured there, its answers mean nothing) and no
prefix cache. The sidecar runs in this process in front of it. For each length a streamed request
(greedy, 16 new tokens) is sent both ways; printed: time to first token, total, prompt tokens the
engine evaluated, the compression time the sidecar reports, and whether the answer holds the fact.

Rows go to --rows as they finish; a rerun skips the rows already there (--fresh starts over).

    .venv/bin/python bench/sidecar_bench.py [--engines llamacpp,vllm,sglang] [--lengths 16000,32000] [--budget 1024]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ilre.engine.engine import Engine, EngineConfig  # noqa: E402
from ilre.service.common.config import ServiceConfig, SidecarConfig  # noqa: E402
from ilre.service.server import ServiceThread  # noqa: E402
from tests.service.engines import EngineServer, LlamaServer, SGLangServer, VllmServer  # noqa: E402
from tests.service.haystacks import QUESTION, haystack  # noqa: E402

ROWS = Path(__file__).resolve().parents[1] / "results" / "bench" / "sidecar.jsonl"
NEW_TOKENS = 16


def start_engine(name: str, window: int) -> EngineServer:
    """The engine with a `window`-token context and no prefix cache, started."""
    if name == "llamacpp":
        return LlamaServer(window, 2, "--override-kv", f"llama.context_length=int:{window}")
    if name == "vllm":
        return VllmServer(window, "--no-enable-prefix-caching", kv_cache_gib=3).start()
    return SGLangServer(window, "--disable-radix-cache", mem_fraction=0.15).start()


def request_for(name: str, prompt: str) -> tuple[str, dict]:
    """(path, body) of a streamed greedy completion in the engine's own format."""
    if name == "llamacpp":
        return "/completion", {"prompt": prompt, "n_predict": NEW_TOKENS, "temperature": 0, "stream": True,
                               "cache_prompt": False}
    return "/v1/completions", {"model": "smollm2", "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0,
                               "stream": True, "stream_options": {"include_usage": True}}


def timed_stream(url: str, body: dict, headers: dict | None = None) -> dict:
    """Send a streamed completion; time to the first content event and to the end."""
    start = time.perf_counter()
    first, text, evaluated = None, "", None
    with httpx.stream("POST", url, json=body, headers=headers or {}, timeout=3600) as reply:
        if reply.status_code != 200:
            raise SystemExit(f"{url}: {reply.status_code} {reply.read().decode()[:300]}")
        reply_headers = reply.headers
        for line in reply.iter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            event = json.loads(line[5:])
            generated = "content" in event or bool(event.get("choices"))  # a new token, even one that prints nothing
            if generated and first is None:
                first = time.perf_counter() - start
            text += event.get("content") or "".join(c.get("text") or "" for c in event.get("choices") or [])
            evaluated = (event.get("usage") or {}).get("prompt_tokens") or event.get("tokens_evaluated") \
                or (event.get("timings") or {}).get("prompt_n") or evaluated
    return {"ttft_s": first, "total_s": time.perf_counter() - start, "text": text, "evaluated": evaluated,
            "compress_ms": reply_headers.get("x-ilre-compress-ms"), "forwarded": reply_headers.get("x-ilre-compressed-tokens")}


def load_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def run_engine(name: str, lengths: list[int], budget: int, engine: Engine, done: set, out: Path) -> None:
    """Every (length, path) row of one engine that `done` lacks, appended to `out` as it finishes."""
    tok = engine.tokenizer
    window = max(lengths) + 4096
    began = time.monotonic()
    server = start_engine(name, window)
    print(f"{name}: ready in {time.monotonic() - began:.1f} s (window {window})", flush=True)
    api = {"llamacpp": "llamacpp", "vllm": "openai", "sglang": "sglang"}[name]
    sidecar = SidecarConfig(engine_url=server.url, engine_api=api, engine_timeout_s=3600)
    config = ServiceConfig(host="127.0.0.1", grpc_port=0, http_port=0)
    try:
        with ServiceThread(config, engine, sidecar=sidecar, tokenizer=tok) as svc:
            for n in lengths:
                prompt = haystack(tok, n) + QUESTION
                path, body = request_for(name, prompt)
                tokens = len(tok(prompt).input_ids)
                # through the sidecar first: a prompt past the model's window can leave vLLM answering the
                # next request wrongly (seen at 32K: " " instead of the code its fresh server gives)
                for way, url, headers in (("sidecar", f"http://127.0.0.1:{svc.http_port}{path}", {"x-ilre-budget": str(budget)}),
                                          ("straight", server.url + path, None)):
                    if (name, n, way) in done:
                        continue
                    r = timed_stream(url, body, headers)
                    row = {"engine": name, "length": n, "path": way, "prompt_tokens": tokens, "budget": budget,
                           "forwarded": int(r["forwarded"] or r["evaluated"] or tokens),
                           "compress_s": float(r["compress_ms"]) / 1000 if r["compress_ms"] else None,
                           "ttft_s": r["ttft_s"], "total_s": r["total_s"], "answer": "7302946" in r["text"],
                           "text": r["text"]}
                    print(json.dumps(row), flush=True)
                    with out.open("a") as f:
                        f.write(json.dumps(row) + "\n")
    finally:
        server.stop()


def print_table(rows: list[dict]) -> None:
    print("\nsidecar vs straight to the engine (embedded SmolLM2-135M: llama.cpp Q4_1 GGUF, vLLM and SGLang bfloat16; "
          f"windows past the model's 8K, where straight answers mean nothing), {NEW_TOKENS} new tokens, streamed, "
          "no prefix cache, 2 CPU cores")
    print(f"| {'engine':<8} | {'prompt tokens':>13} | {'path':<22} | {'forwarded':>9} | {'compress s':>10} | "
          f"{'TTFT s':>7} | {'total s':>7} | answer (its start)")
    for r in sorted(rows, key=lambda r: (["llamacpp", "vllm", "sglang"].index(r["engine"]), r["length"], r["path"] == "sidecar")):
        way = "straight to the engine" if r["path"] == "straight" else "through the sidecar"
        compress = f"{r['compress_s']:.2f}" if r["compress_s"] else "-"
        ttft = f"{r['ttft_s']:.2f}" if r["ttft_s"] is not None else "-"
        print(f"| {r['engine']:<8} | {r['prompt_tokens']:>13} | {way:<22} | {r['forwarded']:>9} | {compress:>10} | "
              f"{ttft:>7} | {r['total_s']:>7.2f} | {r['answer']} {json.dumps(r['text'][:24])}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="llamacpp,vllm,sglang", help="of llamacpp, vllm, sglang")
    parser.add_argument("--lengths", default="16000,32000", help="prompt lengths in tokens")
    parser.add_argument("--budget", type=int, default=1024)
    parser.add_argument("--rows", type=Path, default=ROWS, help="where rows are kept (and resumed from)")
    parser.add_argument("--fresh", action="store_true", help="forget the rows already measured")
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    names = [x for x in args.engines.split(",") if x]
    unknown = set(names) - {"llamacpp", "vllm", "sglang"}
    if unknown:
        parser.error(f"--engines: unknown {', '.join(sorted(unknown))} (known: llamacpp, vllm, sglang)")
    args.rows.parent.mkdir(parents=True, exist_ok=True)
    if args.fresh:
        args.rows.unlink(missing_ok=True)
    rows = [r for r in load_rows(args.rows) if r["budget"] == args.budget]
    done = {(r["engine"], r["length"], r["path"]) for r in rows}
    engine = Engine(EngineConfig(doc_cache_mb=0))  # each engine's rows pay the whole compression, none reuses a document
    for name in names:
        if all((name, n, way) in done for n in lengths for way in ("straight", "sidecar")):
            continue
        run_engine(name, lengths, args.budget, engine, done, args.rows)
    rows = [r for r in load_rows(args.rows) if r["budget"] == args.budget and r["engine"] in names and r["length"] in lengths]
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
