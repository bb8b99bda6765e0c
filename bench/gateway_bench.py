"""`make bench`: the gateway routes (service/transport/gateway.py) over HTTP on loopback, in-process queue.

1. What the gateway shape adds to a call that compresses nothing: POST /v1/compress with a short chat
   (every message passes) against the plain JSON mirror's pass-through request of the same text.
2. A 32K-token tool result: its first gateway compression; GET /v1/retrieve/{hash}?query=... (the
   original compressed for a new question from the cached document) at once, while the background
   deepening has just begun (engine/deepening.py), and again once it is done, with the idle seconds
   the deepening took; and the whole original (no query).
Medians over `--repeats` calls; the same run, the same machine.
Usage: bench/gateway_bench.py [--repeats 30] [--tokens 32768] [--output results/bench/gateway.txt]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from document_bench import QUERY, document  # noqa: E402


def timed(call) -> tuple[float, object]:
    start = time.perf_counter()
    out = call()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--output", default="results/bench/gateway.txt")
    args = parser.parse_args()

    import httpx

    from ilre.engine.engine import Engine, EngineConfig
    from ilre.service.common.config import ServiceConfig
    from ilre.service.server import ServiceThread

    engine = Engine(EngineConfig(deepen=True))  # as `ilre serve` runs it
    config = ServiceConfig(host="127.0.0.1", grpc_port=0, http_port=0)
    lines = [f"# gateway routes, HTTP on loopback, in-process queue ({engine.placement.describe()})", ""]
    chat = [{"role": "system", "content": "You answer from the tool results."},
            {"role": "user", "content": "What is the status of job 7?"},
            {"role": "tool", "content": "job 7: done, 1200 rows written in 31 s."}]
    with ServiceThread(config, engine) as svc, httpx.Client(base_url=f"http://127.0.0.1:{svc.http_port}",
                                                             timeout=3600) as http:
        plain_body = {"context": "".join(m["content"] for m in chat), "query": ".", "ratio": 1.0}
        gateway, plain = [], []
        for _ in range(args.repeats):  # interleaved, so both see the same machine
            gateway.append(timed(lambda: http.post("/v1/compress", json={"messages": chat}))[0])
            plain.append(timed(lambda: http.post("/v1/compress", json=plain_body))[0])
        g, p = statistics.median(gateway), statistics.median(plain)
        lines.append(f"pass-through chat (3 messages, nothing compressed): gateway {1000 * g:.1f} ms, plain "
                     f"pass-through request {1000 * p:.1f} ms: the gateway adds {1000 * (g - p):.1f} ms (medians of "
                     f"{args.repeats})")
        tool = document(args.tokens)
        messages = [{"role": "user", "content": "List the logs."}, {"role": "tool", "content": tool},
                    {"role": "user", "content": QUERY}]
        engine.deepening.wait_idle()
        spent = engine.deepening.stats.seconds  # from here on, every step is this tool result's
        first_s, reply = timed(lambda: http.post("/v1/compress", json={"messages": messages}))
        body = reply.json()
        hash_ = body["ccr_hashes"][0]
        at_once_s, _ = timed(lambda: http.get(f"/v1/retrieve/{hash_}", params={"query": QUERY}))
        engine.deepening.wait_idle()
        deepening_s = engine.deepening.stats.seconds - spent
        retrieve = [timed(lambda: http.get(f"/v1/retrieve/{hash_}", params={"query": QUERY}))
                    for _ in range(3)]
        again_s = statistics.median(t for t, _ in retrieve)
        whole_s, whole = timed(lambda: http.get(f"/v1/retrieve/{hash_}"))
        assert whole.json()["original_content"] == tool
        lines.append(f"{body['tokens_before']}-token chat (a tool result of {args.tokens} tokens): first gateway "
                     f"compression {first_s:.2f} s; query-aware retrieve at once {at_once_s:.2f} s (the candidate pass "
                     f"again, {first_s / at_once_s:.1f}x faster); the background deepening then took {deepening_s:.1f} s "
                     f"of idle time; query-aware retrieve once deepened {1000 * again_s:.0f} ms ({first_s / again_s:.0f}x "
                     f"faster, 1/{first_s / again_s:.0f} of the first; median of 3); the whole original "
                     f"{1000 * whole_s:.0f} ms; passkey {'kept' if '83921' in body['messages'][1]['content'] else 'lost'} "
                     f"by the compression, {'kept' if '83921' in retrieve[0][1].json()['original_content'] else 'lost'} "
                     "by the retrieve")
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(text)


if __name__ == "__main__":
    main()
