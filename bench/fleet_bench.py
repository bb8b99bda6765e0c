"""A fleet of agents through one `ilre sidecar` with its default settings, and one long agent.

Each agent's step appends the model's call of a tool and its result (~TOKENS tokens of a real file: Python's standard
library sources, a file of its own per step and agent) and asks for the audit code planted in that agent's first
result. Arms, each on a sidecar process of its own (`ilre sidecar --engine-api openai --ratio 0.12`, defaults
otherwise: `--dtype auto`, deepening while idle, the 1 GiB document cache) in front of llama.cpp's server (through a
recording relay, so the prompt the engine got is read back, with --engine; by default on the sidecar's own gateway
route, `/ilre/v1/compress`, the same compression of the same messages answered with the messages the engine would
get, so that 2 cores are not spent on the engine's prefill):
- fleet:  --agents agents x --steps steps, interleaved round robin (agent 1's step, agent 2's, ...), each request
          sent as soon as the one before it is answered;
- alone:  one agent at a time, the same steps (--alone agents one after another, each on a sidecar of its own);
- cold:   --cold agents on a sidecar with `--doc-cache-mb 0`: each step compressed with nothing cached (each arm's
          step s of agent a is set against agent a's step s here);
- long:   one agent x --long-steps steps through `ilre serve`'s gateway route (the same compression of the
          conversation, fresh mode, without an engine's prefill per step), the compression time per step;
- fill:   `ilre serve` with its defaults (a worker's engine and cache) sent distinct 8K-token documents of real text
          until its cache has evicted for a while: the peak RSS with the default cache full (deploy/'s limits).
Each process first runs two steps of an agent no arm measures (warm_up). Per step: the compression the sidecar reports (x-ilre-compress-ms), the tokens before and after, whether the planted
code reached the engine. Per arm: the cache's bytes (by part), documents and evictions from /metrics, the process's
peak RSS. Rows go to --rows as each arm finishes; a rerun measures only the arms not there (--fresh: all again).

    .venv/bin/python bench/fleet_bench.py [--agents 16] [--steps 30] [--long-steps 100] [--arms fleet,alone,cold,long,fill]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ilre.models.embedded import embedded_checkpoint  # noqa: E402
from ilre.models.loader import load_tokenizer  # noqa: E402
from tests.service.engines import LlamaServer, RecordingRelay  # noqa: E402

ROWS = Path(__file__).resolve().parents[1] / "results" / "bench" / "fleet.jsonl"
ILRE = [str(Path(sys.executable).parent / "ilre")]
TOKENS = 1100
RATIO = 0.12
SYSTEM = "You are a code auditor. Use the tools' results to answer the user's questions exactly."
STDLIB = Path(sysconfig.get_paths()["stdlib"])


def files(tokenizer, count: int) -> list[tuple[str, str]]:
    """(path, ~TOKENS-token text) of `count` slices of standard-library sources, in a fixed order."""
    out: list[tuple[str, str]] = []
    for path in sorted(STDLIB.rglob("*.py")):
        if len(out) >= count or "test" in path.parts or path.stat().st_size < 12 * TOKENS:
            continue
        ids = tokenizer(path.read_text(errors="replace"), add_special_tokens=False).input_ids
        for start in range(0, len(ids) - TOKENS, 4 * TOKENS):
            out.append((f"{path.relative_to(STDLIB)}@{start}", tokenizer.decode(ids[start:start + TOKENS])))
            if len(out) >= count:
                break
    if len(out) < count:
        raise SystemExit(f"only {len(out)} slices of the standard library, {count} wanted")
    return out


def agent_trace(sources: list[tuple[str, str]], agent: int, steps: int) -> list[dict]:
    """An agent's steps: the file it reads (its own slice each step) and, in the first, the planted code."""
    rng = random.Random(agent)
    code = str(rng.randrange(1_000_000, 9_999_999))
    out = []
    for step in range(steps):
        path, text = sources[agent * steps + step]
        if step == 0:
            at = text.rfind("\n", 0, len(text) * 2 // 5) + 1
            text = text[:at] + f"# The audit code of {path} is {code}.\n" + text[at:]
            first = path
        out.append({"path": path, "result": text})
    question = f"What is the audit code of {first}? Reply with the number."
    return [{**s, "question": question, "code": code} for s in out]


def chat(trace: list[dict], upto: int) -> list[dict]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Audit the files you read."}]
    for i, step in enumerate(trace[:upto + 1]):
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": "read_file", "arguments": json.dumps({"path": step["path"]})}}
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"call_{i}", "content": step["result"]}]
    return messages + [{"role": "user", "content": trace[upto]["question"]}]


class Process:
    """An `ilre` server process (sidecar or serve) on a free port, its startup line read; peak RSS from /proc."""

    def __init__(self, *args: str, ready: bool = True):
        self.proc = subprocess.Popen([*ILRE, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "ILRE_LOG_LEVEL": "warning"})
        self.lines: list[str] = []
        threading.Thread(target=lambda: [self.lines.append(l) for l in self.proc.stderr], daemon=True).start()
        deadline = time.monotonic() + 300
        while not any(l.startswith("ilre: ") for l in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("ilre did not start: " + "".join(self.lines))
            time.sleep(0.2)
        line = next(l for l in self.lines if l.startswith("ilre: "))
        self.url = "http://127.0.0.1:" + re.findall(r"https?://[\d.]+:(\d+)", line)[0]
        self.own = self.url + ("/ilre" if args[0] == "sidecar" else "")  # where its readyz and metrics are
        probe = "/readyz" if ready else "/v1/model"  # a sidecar with no engine behind it is never ready: its model
        while httpx.get(self.own + probe, timeout=30).status_code != 200:
            time.sleep(0.5)

    def peak_rss_mib(self) -> float:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024

    def cache(self) -> dict:
        text = httpx.get(self.own + "/metrics", timeout=30).text

        def value(name: str, labels: str = "") -> float:
            found = re.search(rf"^{name}{re.escape(labels)} ([\d.e+]+)$", text, re.M)
            return float(found.group(1)) if found else 0.0

        parts = {p: value("ilre_doc_cache_part_bytes", f'{{part="{p}"}}')
                 for p in ("ids", "units", "keys", "parts", "windows", "scores", "stream", "rows", "resume")}
        evicted = sum(float(v) for v in re.findall(r'^ilre_doc_cache_evictions_total\{[^}]*tier="local"[^}]*\} ([\d.e+]+)$',
                                                  text, re.M))
        documents_evicted = sum(float(v) for v in re.findall(r"^ilre_doc_cache_documents_evicted_total\{[^}]*\} ([\d.e+]+)$",
                                                             text, re.M))
        return {"bytes": value("ilre_doc_cache_bytes"), "documents": value("ilre_doc_cache_documents"),
                "evictions": evicted, "documents_evicted": documents_evicted, "parts": parts,
                "peak_rss_mib": round(self.peak_rss_mib(), 1)}

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def sidecar_steps(traces: list[list[dict]], steps: int, relay: RecordingRelay | None, tokenizer,
                  *flags: str) -> tuple[list[dict], dict]:
    """Every agent's steps through one sidecar, round robin; (rows, the cache and RSS at the end). With a relay,
    on the chat route in front of the engine; without, on the sidecar's own gateway route (`/ilre/v1/compress`: the
    same compression of the same messages, its answer the messages the engine would get)."""
    sidecar = Process("sidecar", "--engine-url", relay.url if relay else "http://127.0.0.1:9", "--engine-api",
                      "openai", "--ratio", str(RATIO), "--port", "0", "--engine-timeout", "3600", *flags,
                      ready=relay is not None)
    rows = []
    try:
        with httpx.Client(timeout=3600) as client:
            warm_up(client, sidecar.url + "/ilre/v1/compress", traces[0], tokenizer)
            for step in range(steps):
                for agent, trace in enumerate(traces):
                    messages = chat(trace, step)
                    if relay is not None:
                        row = _through_engine(client, sidecar, relay, messages)
                    else:
                        row = _through_gateway(client, sidecar.url + "/ilre/v1/compress", messages, tokenizer)
                    sent = row.pop("sent")
                    rows.append({"agent": agent, "step": step + 1, **row, "reached": trace[0]["code"] in sent})
                print(f"  step {step + 1}: compress {statistics.median(r['compress_ms'] for r in rows[-len(traces):]):.0f} ms "
                      f"(median of {len(traces)}), reached {sum(r['reached'] for r in rows[-len(traces):])}/{len(traces)}",
                      flush=True)
        return rows, sidecar.cache()
    finally:
        sidecar.stop()


def warm_up(client: httpx.Client, url: str, trace: list[dict], tokenizer) -> None:
    """Two steps of an agent no arm measures (its tool results reversed: other documents), so that every arm is
    measured on a service that has run its paths once, as a service that has been up has."""
    other = [{**step, "result": step["result"][::-1]} for step in trace[:2]]
    for step in range(2):
        _through_gateway(client, url, chat(other, step), tokenizer)


def _through_engine(client: httpx.Client, sidecar: Process, relay: RecordingRelay, messages: list[dict]) -> dict:
    """One step on the sidecar's chat route: the compression it reports and the prompt the engine got."""
    body = {"model": "smollm2", "messages": messages, "max_tokens": 1, "temperature": 0}
    reply = client.post(sidecar.url + "/v1/chat/completions", json=body)
    if reply.status_code != 200:
        raise SystemExit(f"{reply.status_code} {reply.text[:300]}")
    return {"compress_ms": float(reply.headers.get("x-ilre-compress-ms", 0)),
            "original_tokens": int(reply.headers.get("x-ilre-original-tokens", 0)),
            "forwarded_tokens": int(reply.headers.get("x-ilre-compressed-tokens", 0)),
            "sent": relay.last("/v1/chat/completions").body.decode(errors="replace")}


def _through_gateway(client: httpx.Client, url: str, messages: list[dict], tokenizer) -> dict:
    """One step on a gateway route (the budget: RATIO of the text messages' tokens, as the sidecar's --ratio)."""
    tokens = sum(len(tokenizer(m["content"]).input_ids) for m in messages if m.get("content"))
    began = time.perf_counter()
    reply = client.post(url, json={"messages": messages, "budget": max(1, round(RATIO * tokens))})
    wall = time.perf_counter() - began
    if reply.status_code != 200:
        raise SystemExit(f"{reply.status_code} {reply.text[:300]}")
    data = reply.json()
    return {"compress_ms": round(wall * 1000, 1), "original_tokens": data["tokens_before"],
            "forwarded_tokens": data["tokens_after"], "sent": json.dumps(data["messages"])}


def gateway_steps(trace: list[dict], tokenizer) -> tuple[list[dict], dict]:
    """One agent's steps through `ilre serve`'s gateway route (fresh mode's compression, no engine)."""
    served = Process("serve", "--grpc-port", "0", "--http-port", "0")
    rows = []
    try:
        with httpx.Client(timeout=3600) as client:
            warm_up(client, served.url + "/v1/compress", trace, tokenizer)
            for step in range(len(trace)):
                row = _through_gateway(client, served.url + "/v1/compress", chat(trace, step), tokenizer)
                sent = row.pop("sent")
                rows.append({"agent": 0, "step": step + 1, **row, "reached": trace[0]["code"] in sent})
                if (step + 1) % 10 == 0:
                    print(f"  step {step + 1}: compress {row['compress_ms']:.0f} ms", flush=True)
        return rows, served.cache()
    finally:
        served.stop()


def fill_steps(tokenizer, tokens: int) -> tuple[list[dict], dict]:
    """`ilre serve` with its defaults (the engine and the 1 GiB cache a worker holds) sent distinct `tokens`-token
    documents of real text, one question each, until its cache has evicted for a while: its peak RSS with the
    default cache full."""
    from ilre.evaluation.tasks.haystack import pydoc_text, shakespeare_text

    ids = tokenizer(pydoc_text() + shakespeare_text(), add_special_tokens=False).input_ids
    served = Process("serve", "--grpc-port", "0", "--http-port", "0")
    rows, after = [], 0
    try:
        with httpx.Client(timeout=3600) as client:
            for i in range(10_000):
                start = i * tokens // 3 % max(len(ids) - tokens, 1)  # overlapping slices: distinct documents
                began = time.perf_counter()
                reply = client.post(served.url + "/v1/compress", json={
                    "context_ids": ids[start:start + tokens], "query": "Question: what is this text about? Answer:",
                    "budget": 1024})
                if reply.status_code != 200:
                    raise SystemExit(f"fill request {i}: {reply.status_code} {reply.text[:300]}")
                rows.append({"agent": 0, "step": i + 1, "compress_ms": round((time.perf_counter() - began) * 1000, 1),
                             "reached": True})
                cache = served.cache()
                after += cache["documents_evicted"] > 0 or cache["evictions"] > 0
                if (i + 1) % 20 == 0:
                    print(f"  {i + 1} documents: cache {cache['bytes'] / 2**20:.0f} MiB, evictions {cache['evictions']:.0f}, "
                          f"peak RSS {cache['peak_rss_mib']} MiB", flush=True)
                if after >= 40:  # a while at the cap
                    break
        return rows, served.cache()
    finally:
        served.stop()


def summary(arms: dict[str, dict]) -> None:
    print("\n| arm | steps | compress ms, median of steps 25-30 | max step / cold's | reached | cache MiB | documents | "
          "evictions (documents) | bytes per message | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    cold = {(r["agent"], r["step"]): r["compress_ms"] for r in arms.get("cold", {}).get("rows", [])}
    for name, arm in arms.items():
        rows, cache = arm["rows"], arm["cache"]
        late = [r["compress_ms"] for r in rows if 25 <= r["step"] <= 30]
        worst = max((r["compress_ms"] / cold[r["agent"], r["step"]] for r in rows if (r["agent"], r["step"]) in cold),
                    default=None)  # the same agent's same step with nothing cached
        # the messages its cache held at the end: every agent's (alone: the last agent's, each had a sidecar of its own)
        messages = max(r["step"] for r in rows) if name == "alone" else len({(r["agent"], r["step"]) for r in rows})
        print(f"| {name} | {len(rows)} | {statistics.median(late) if late else '-'} | "
              f"{f'{worst:.2f}' if worst is not None and name not in ('cold', 'fill') else '-'} | {sum(r['reached'] for r in rows)}/{len(rows)} | "
              f"{cache['bytes'] / 2**20:.0f} | {cache['documents']:.0f} | {cache['evictions']:.0f} ({cache['documents_evicted']:.0f}) | "
              f"{cache['parts']['keys'] / max(messages, 1) / 2**20:.2f} MiB keys, "
              f"{(cache['bytes'] - cache['parts']['keys']) / max(messages, 1) / 2**20:.2f} MiB else | {cache['peak_rss_mib']} |")
    if "long" in arms:
        by_step = {r["step"]: r["compress_ms"] for r in arms["long"]["rows"]}
        last = max(by_step)
        if 10 in by_step:
            print(f"\nlong agent: step 10 {by_step[10]:.0f} ms, step {last} {by_step[last]:.0f} ms "
                  f"({by_step[last] / by_step[10]:.2f}x)")
    if "fleet" in arms and "alone" in arms:
        def late(rows):
            return statistics.median(r["compress_ms"] for r in rows if 25 <= r["step"] <= 30)
        print(f"fleet / alone, median of steps 25-30: {late(arms['fleet']['rows']) / late(arms['alone']['rows']):.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--long-steps", type=int, default=100)
    parser.add_argument("--alone", type=int, default=4, help="agents measured alone, one after another")
    parser.add_argument("--cold", type=int, default=2, help="agents measured with nothing cached")
    parser.add_argument("--arms", default="fleet,alone,cold,long,fill")
    parser.add_argument("--rows", type=Path, default=ROWS)
    parser.add_argument("--fresh", action="store_true", help="measure every arm again")
    parser.add_argument("--engine", action="store_true", help="the sidecar's arms on its chat route in front of "
                        "llama.cpp's server (its prefill then takes most of the run on 2 cores), not its gateway route")
    args = parser.parse_args()
    args.rows.parent.mkdir(parents=True, exist_ok=True)
    if args.fresh:
        args.rows.unlink(missing_ok=True)
    done = {a["arm"]: a for a in map(json.loads, args.rows.read_text().splitlines())} if args.rows.is_file() else {}
    wanted = args.arms.split(",")
    tokenizer = load_tokenizer(embedded_checkpoint())
    sources = files(tokenizer, max(args.agents * args.steps, args.long_steps))
    traces = [agent_trace(sources, a, args.steps) for a in range(args.agents)]
    todo = [arm for arm in wanted if arm not in done]
    server = relay = None
    if args.engine and any(arm not in ("long", "fill") for arm in todo):
        server = LlamaServer(8192)
        relay = RecordingRelay(server.port)
    try:
        for arm in todo:
            print(f"{arm}:", flush=True)
            if arm == "fleet":
                rows, cache = sidecar_steps(traces, args.steps, relay, tokenizer)
            elif arm == "alone":  # one agent at a time, --alone agents one after another: that many samples a step
                rows, cache = [], None
                for agent in range(args.alone):
                    mine, cache = sidecar_steps([traces[agent]], args.steps, relay, tokenizer)
                    rows += [{**r, "agent": agent} for r in mine]
            elif arm == "cold":
                rows, cache = sidecar_steps(traces[:args.cold], args.steps, relay, tokenizer, "--doc-cache-mb", "0")
            elif arm == "fill":
                rows, cache = fill_steps(tokenizer, 8192)
            else:
                rows, cache = gateway_steps(agent_trace(sources, 0, args.long_steps), tokenizer)
            done[arm] = {"arm": arm, "rows": rows, "cache": cache}
            with args.rows.open("a") as f:
                f.write(json.dumps(done[arm]) + "\n")
    finally:
        if relay is not None:
            relay.close()
        if server is not None:
            server.stop()
    summary({arm: done[arm] for arm in wanted if arm in done})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
