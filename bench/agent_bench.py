"""Agents through the sidecar in front of vLLM: a 20-step trace on each conversation API (OpenAI chat,
OpenAI Responses, Anthropic Messages), every step sent as soon as the previous answer arrives.

Each step adds the model's call of a tool (`read_file`, `grep`) and its result: ~TOKENS tokens of a real
file on this machine (Python's own source, its reference text, JSON records of the installed packages,
numpy's CSV validation sets, the package manager's log, a grep-like listing of the standard library),
with one line planted in it naming an audit code. Each step's question asks for the code of one earlier
result. Arms, each under an API key of its own (its own document scope) and on an empty document cache (as
on a service of its own: the arms' encodings together would outgrow the default 1 GiB), the sidecar's arms
on an empty vLLM prefix cache:
- fresh:   history mode fresh (every message compressed for the live question; encodings cached),
- frozen:  history mode frozen (each message compressed once, then sent the same: the prefix cache hits),
- cold:    the same messages through the gateway (`/ilre/v1/compress`, the same compression), each step
           under a new key: nothing cached, the cost of compressing without resuming,
- gateway: the same messages through the gateway under one key: the answers it keeps.
Per step: compression ms, the engine's prompt tokens and the tokens it prefilled (its own metrics:
prompt tokens less prefix-cache hits), the tokens of messages already sent (whose encodings the
service holds), whether the answer's code reached the engine, and whether the model's answer holds it.
Rows go to --rows as they finish; a rerun skips the rows already there (--fresh starts over, --redo ARMS
measures those arms again).

    .venv/bin/python bench/agent_bench.py [--apis openai.chat,openai.responses,anthropic.messages] [--steps 20]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import random
import re
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ilre.contract.conversation import read_conversation  # noqa: E402
from ilre.engine.documents import DocumentCache  # noqa: E402
from ilre.engine.engine import Engine, EngineConfig  # noqa: E402
from ilre.evaluation.tasks.haystack import pydoc_text  # noqa: E402
from ilre.service.common.config import SidecarConfig  # noqa: E402
from ilre.service.server import ServiceThread  # noqa: E402
from tests.service.agent_steps import APIS  # noqa: E402
from tests.service.conftest import service_config  # noqa: E402
from tests.service.engines import RecordingRelay, VllmServer, _gauge  # noqa: E402

ROWS = Path(__file__).resolve().parents[1] / "results" / "bench" / "agent.jsonl"
ARMS = ("fresh", "frozen", "cold", "gateway")
TOKENS = 1200  # of each tool result
RATIO = 0.12  # of each step's text kept (frozen: of what the step adds)
WINDOW = 8192
SYSTEM = "You are a code auditor. Use the tools' results to answer the user's questions exactly."
TASK = "Audit this machine's Python installation; I will ask you about the files you read."
STDLIB = Path(sysconfig.get_paths()["stdlib"])


# -- the trace: real files, one planted line each ---------------------------------------------------------
def _python_source() -> str:
    return "\n".join((STDLIB / name).read_text() for name in ("argparse.py", "textwrap.py", "json/decoder.py", "csv.py",
                                                              "shutil.py", "tarfile.py"))


def _json_records() -> str:
    rows = [{"name": d.metadata["Name"], "version": d.version, "summary": d.metadata.get("Summary"),
             "requires": sorted(d.requires or [])[:6]} for d in importlib.metadata.distributions()]
    return "\n".join(json.dumps(r) for r in sorted(rows, key=lambda r: str(r["name"]).lower()))


def _csv() -> str:
    import numpy
    folder = Path(numpy.__file__).parent / "_core" / "tests" / "data"
    return "\n".join(p.read_text() for p in sorted(folder.glob("umath-validation-set-*.csv")))


def _log() -> str:
    for path in ("/var/log/dpkg.log", "/var/log/apt/history.log", "/var/log/alternatives.log"):
        if Path(path).is_file():
            return Path(path).read_text(errors="replace")
    return sysconfig.get_config_var("CONFIG_ARGS") or ""


def _grep() -> str:
    lines = []
    for path in sorted(STDLIB.glob("*.py"))[:80]:
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if re.match(r"\s*(def|class) ", line):
                lines.append(f"{path.relative_to(STDLIB)}:{n}:{line}")
    return "\n".join(lines)


SOURCES = (("src/python", _python_source), ("docs/reference.txt", pydoc_text), ("data/packages.jsonl", _json_records),
           ("data/validation.csv", _csv), ("logs/packages.log", _log), ("grep -rn 'def |class '", _grep))


def trace(tokenizer, steps: int) -> list[dict]:
    """Each step: its tool call (name, path), its result (text with one planted line), the audit code
    planted, and the question (asking for the code of an earlier or this result)."""
    texts = {name: make() for name, make in SOURCES}
    out = []
    for i in range(steps):
        name, _ = SOURCES[i % len(SOURCES)]
        ids = tokenizer(texts[name][:200_000], add_special_tokens=False).input_ids
        start = (i // len(SOURCES)) * TOKENS % max(len(ids) - TOKENS, 1)
        text = tokenizer.decode(ids[start:start + TOKENS])
        code = str(random.Random(i).randrange(1_000_000, 9_999_999))
        path = f"{name}#{i}"
        at = text.rfind("\n", 0, len(text) * (3 + i % 5) // 10) + 1
        text = text[:at] + f"The audit code of {path} is {code}.\n" + text[at:]
        out.append({"tool": "grep" if name.startswith("grep") else "read_file", "path": path, "result": text, "code": code})
    for i, step in enumerate(out):
        asked = out[max(0, i - 1 - i % 3)]
        step["question"] = f"What is the audit code of {asked['path']}? Reply with the number."
        step["answer"] = asked["code"]
    return out


def chat_messages(steps: list[dict], upto: int) -> list[dict]:
    """The OpenAI chat of step `upto`: instructions, task, every call and result so far, the question."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    for i, step in enumerate(steps[:upto + 1]):
        arguments = json.dumps({"path": step["path"]})
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": step["tool"], "arguments": arguments}}]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": step["result"]})
    messages.append({"role": "user", "content": steps[upto]["question"]})
    return messages


TOOLS = [{"name": name, "description": f"{name} a path", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}}, "required": ["path"]}} for name in ("read_file", "grep")]


def body_for(api: str, messages: list[dict]) -> dict:
    """The chat `messages` as a body of `api` (the same turns in its own shape), greedy, 16 new tokens."""
    if api == "openai.chat":
        return {"model": "smollm2", "messages": messages, "max_tokens": 16, "temperature": 0,
                "tools": [{"type": "function", "function": t} for t in TOOLS]}
    if api == "openai.responses":
        items = []
        for m in messages[1:]:
            if m.get("tool_calls"):
                call = m["tool_calls"][0]
                items.append({"type": "function_call", "call_id": call["id"], "name": call["function"]["name"],
                              "arguments": call["function"]["arguments"]})
            elif m["role"] == "tool":
                items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
            else:
                items.append({"role": m["role"], "content": m["content"]})
        return {"model": "smollm2", "instructions": messages[0]["content"], "input": items, "max_output_tokens": 16,
                "temperature": 0, "tools": [{"type": "function", **t} for t in TOOLS]}
    turns = []
    for m in messages[1:]:
        if m.get("tool_calls"):
            call = m["tool_calls"][0]
            turns.append({"role": "assistant", "content": [{"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                                                            "input": json.loads(call["function"]["arguments"])}]})
        elif m["role"] == "tool":
            turns.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}]})
        elif turns and turns[-1]["role"] == "user" and isinstance(turns[-1]["content"], list):
            turns[-1]["content"].append({"type": "text", "text": m["content"]})
        else:
            turns.append({"role": m["role"], "content": m["content"]})
    return {"model": "smollm2", "system": messages[0]["content"], "messages": turns, "max_tokens": 16, "temperature": 0,
            "tools": [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]} for t in TOOLS]}


def answer_text(api: str, answer: dict) -> str:
    if api == "openai.chat":
        return answer["choices"][0]["message"].get("content") or ""
    if api == "openai.responses":
        return "".join(p.get("text", "") for item in answer.get("output", []) if item.get("type") == "message"
                       for p in item.get("content", []))
    return "".join(b.get("text", "") for b in answer.get("content", []) if b.get("type") == "text")


def prefill_counters(server: VllmServer) -> tuple[int, int]:
    """(prompt tokens, prefix-cache hit tokens) vLLM has counted so far."""
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return _gauge(text, "vllm:prompt_tokens_total"), _gauge(text, "vllm:prefix_cache_hits_total")


# -- the arms -------------------------------------------------------------------------------------------------
def through_sidecar(api: str, arm: str, steps: list[dict], port: int, relay: RecordingRelay, server: VllmServer,
                    done: set, out: Path) -> None:
    sent_before: set[str] = set()
    for i in range(len(steps)):
        messages = chat_messages(steps, i)
        body = body_for(api, messages)
        texts = {m["content"] for m in messages if m["role"] == "tool"}
        if (api, arm, i) in done:
            sent_before |= texts
            continue
        prompt0, hits0 = prefill_counters(server)
        began = time.perf_counter()
        reply = httpx.post(f"http://127.0.0.1:{port}{APIS[api]}", json=body, timeout=3600,
                           headers={"authorization": f"Bearer agent-{arm}-{api}", "x-ilre-history": arm,
                                    "x-ilre-ratio": str(RATIO)})
        wall = time.perf_counter() - began
        if reply.status_code != 200:
            raise SystemExit(f"{api} {arm} step {i}: {reply.status_code} {reply.text[:300]}")
        prompt1, hits1 = prefill_counters(server)
        forwarded = json.dumps(relay.last(APIS[api]).json())
        resumed = sum(len(t) for t in texts & sent_before) / max(sum(len(t) for t in texts), 1)
        sent_before |= texts
        row = {"api": api, "arm": arm, "step": i, "wall_s": round(wall, 3),
               "compress_ms": float(reply.headers.get("x-ilre-compress-ms", 0)),
               "original_tokens": int(reply.headers.get("x-ilre-original-tokens", 0)),
               "forwarded_tokens": int(reply.headers.get("x-ilre-compressed-tokens", 0)),
               "engine_prompt_tokens": prompt1 - prompt0, "engine_prefilled": (prompt1 - prompt0) - (hits1 - hits0),
               "resumed_share": round(resumed, 3), "reached": steps[i]["answer"] in forwarded,
               "answered": steps[i]["answer"] in answer_text(api, reply.json())}
        keep(row, out)


def through_gateway(api: str, arm: str, steps: list[dict], port: int, tokenizer, done: set, out: Path) -> None:
    for i in range(len(steps)):
        if (api, arm, i) in done:
            continue
        neutral = read_conversation(api, body_for(api, chat_messages(steps, i))).messages
        key = f"agent-cold-{api}-{i}" if arm == "cold" else f"agent-gateway-{api}"
        budget = max(1, round(RATIO * sum(len(tokenizer(m["content"]).input_ids) for m in neutral if m["content"])))
        began = time.perf_counter()
        reply = httpx.post(f"http://127.0.0.1:{port}/ilre/v1/compress", timeout=3600, headers={"authorization": f"Bearer {key}"},
                           json={"messages": neutral, "budget": budget})
        wall = time.perf_counter() - began
        if reply.status_code != 200:
            raise SystemExit(f"gateway {api} step {i}: {reply.status_code} {reply.text[:300]}")
        data = reply.json()
        kept = json.dumps(data["messages"])
        keep({"api": api, "arm": arm, "step": i, "wall_s": round(wall, 3), "compress_ms": round(wall * 1000, 1),
              "original_tokens": data["tokens_before"], "forwarded_tokens": data["tokens_after"],
              "reached": steps[i]["answer"] in kept}, out)


def keep(row: dict, out: Path) -> None:
    print(json.dumps(row), flush=True)
    with out.open("a") as f:
        f.write(json.dumps(row) + "\n")


def forget_prefixes(server: VllmServer) -> None:
    """Empty vLLM's prefix cache (its development route, on with VLLM_SERVER_DEV_MODE=1), so that an arm's prefilled
    tokens do not count hits on an earlier arm's prompts (vLLM renders the three APIs into the same prompts)."""
    for _ in range(30):
        reply = httpx.post(server.url + "/reset_prefix_cache", timeout=60)
        reply.raise_for_status()
        if reply.json().get("success"):
            return
        time.sleep(1)  # blocks still held by a request finishing
    raise SystemExit("vLLM did not empty its prefix cache")


def summary(rows: list[dict]) -> None:
    print("\nagents through the sidecar in front of vLLM (embedded SmolLM2-135M, float32), 2 CPU cores; "
          f"each step ~{TOKENS}-token tool result from a real file, ratio {RATIO}, sent at once; deepening on, as "
          "`ilre sidecar` runs")
    print("| API | arm | steps | compress s, step 1 | compress s, steps 2-N | vs cold | engine prompt | engine prefilled | answers reached | answered |")
    for api in APIS:
        cold = {r["step"]: r for r in rows if r["api"] == api and r["arm"] == "cold"}
        for arm in ARMS:
            mine = sorted((r for r in rows if r["api"] == api and r["arm"] == arm), key=lambda r: r["step"])
            if not mine:
                continue
            later = [r for r in mine if r["step"] > 0]
            cost = sum(r["compress_ms"] for r in later) / 1000
            both = [r for r in later if r["step"] in cold]  # the steps measured cold too
            base = sum(cold[r["step"]]["compress_ms"] for r in both) / 1000
            ratio = f"{sum(r['compress_ms'] for r in both) / 1000 / base:.2f}x ({len(both)} steps)" if base else "-"
            prompt = sum(r.get("engine_prompt_tokens", 0) for r in mine)
            prefilled = sum(r.get("engine_prefilled", 0) for r in mine)
            reached = sum(r["reached"] for r in mine)
            answered = sum(r.get("answered", False) for r in mine) if arm in ("fresh", "frozen") else "-"
            print(f"| {api} | {arm} | {len(mine)} | {mine[0]['compress_ms'] / 1000:.2f} | {cost:.2f} | {ratio} | "
                  f"{prompt or '-'} | {prefilled or '-'} | {reached}/{len(mine)} | {answered} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apis", default=",".join(APIS))
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rows", type=Path, default=ROWS)
    parser.add_argument("--fresh", action="store_true", help="forget the rows already measured")
    parser.add_argument("--redo", default="", help="arms whose rows of --apis are measured again (the others kept)")
    args = parser.parse_args()
    apis, arms = args.apis.split(","), args.arms.split(",")
    args.rows.parent.mkdir(parents=True, exist_ok=True)
    if args.fresh:
        args.rows.unlink(missing_ok=True)
    rows = [json.loads(x) for x in args.rows.read_text().splitlines()] if args.rows.is_file() else []
    if args.redo:
        redo = set(args.redo.split(","))
        rows = [r for r in rows if not (r["arm"] in redo and r["api"] in apis)]
        args.rows.write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = {(r["api"], r["arm"], r["step"]) for r in rows}
    if all((api, arm, i) in done for api in apis for arm in arms for i in range(args.steps)):
        summary(rows)
        return 0
    engine = Engine(EngineConfig(dtype="float32", deepen=True))  # as `ilre sidecar` runs: deepening while idle (its default)
    steps = trace(engine.tokenizer, args.steps)
    keys = Path(tempfile.mkdtemp()) / "keys.txt"
    keys.write_text("\n".join(f"agent-{arm}-{api}" for arm in ("fresh", "frozen", "gateway") for api in APIS) + "\n" +
                    "\n".join(f"agent-cold-{api}-{i}" for api in APIS for i in range(args.steps)) + "\n")
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # its /reset_prefix_cache, between arms
    server = VllmServer(WINDOW, "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--dtype", "float32",
                        kv_cache_gib=2).start()
    relay = RecordingRelay(server.port)
    sidecar = SidecarConfig(engine_url=relay.url, engine_api="openai", engine_timeout_s=3600)
    try:
        with ServiceThread(service_config(api_keys_file=str(keys)), engine, sidecar=sidecar, tokenizer=engine.tokenizer) as svc:
            for api in apis:
                for arm in arms:
                    if all((api, arm, i) in done for i in range(args.steps)):
                        continue
                    # each arm as on a service of its own: an empty document cache (and engine prefix cache, below)
                    engine.documents = DocumentCache(engine.config.doc_cache_mb << 20, None, engine.config.doc_cache_share)
                    if arm in ("fresh", "frozen"):
                        forget_prefixes(server)
                        through_sidecar(api, arm, steps, svc.http_port, relay, server, done, args.rows)
                    else:
                        through_gateway(api, arm, steps, svc.http_port, engine.tokenizer, done, args.rows)
    finally:
        relay.close()
        server.stop()
    summary([json.loads(x) for x in args.rows.read_text().splitlines()])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
