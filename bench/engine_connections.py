"""How llama.cpp's server closes kept-alive connections, and what that costs a pooled client.

Prints: when the engine closes a connection after a non-streamed and after a streamed answer; then,
through the tests' recording relay, how many of 20 requests sent 4.990-5.010 s after the previous one
on the same connection fail unanswered, with the pool's idle limit at 30 s and at the sidecar's
IDLE_CONNECTION_S. Needs `make engine` (llama-server). About 4 minutes on 2 cores.
"""

from __future__ import annotations

import asyncio
import json
import select
import sys
import time
from http.client import HTTPConnection
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ilre.service.sidecar.upstream import IDLE_CONNECTION_S  # noqa: E402
from tests.service.engines import LlamaServer, RecordingRelay  # noqa: E402


def close_after(port: int, stream: bool) -> float | None:
    """Seconds from the end of one /completion answer to the engine's close (None: open after 8 s)."""
    conn = HTTPConnection("127.0.0.1", port, timeout=30)
    body = json.dumps({"prompt": "Count: 1, 2,", "n_predict": 8, "temperature": 0, "stream": stream})
    conn.request("POST", "/completion", body, {"content-type": "application/json"})
    conn.getresponse().read()
    start = time.monotonic()
    readable, _, _ = select.select([conn.sock], [], [], 8.0)
    closed = bool(readable) and conn.sock.recv(1) == b""
    conn.close()
    return time.monotonic() - start if closed else None


async def failures(url: str, idle_limit_s: float, tries: int = 20) -> int:
    """Requests that fail unanswered when each goes 4.990-5.010 s after the previous one."""
    failed = 0
    async with httpx.AsyncClient(base_url=url, limits=httpx.Limits(keepalive_expiry=idle_limit_s)) as client:
        await client.get("/health")
        for k in range(tries):
            await asyncio.sleep(4.990 + k * 0.020 / (tries - 1))
            try:
                await client.get("/health")
            except httpx.RemoteProtocolError:
                failed += 1
    return failed


def main() -> None:
    engine = LlamaServer(ctx_size=512)
    relay = RecordingRelay(engine.port)
    try:
        for stream in (False, True):
            after = close_after(engine.port, stream)
            said = "kept open 8 s" if after is None else f"closed after {after * 1000:.2f} ms"
            print(f"llama-server, {'streamed' if stream else 'non-streamed'} answer: connection {said}")
        for limit in (30.0, IDLE_CONNECTION_S):
            print(f"pool idle limit {limit:g} s: {asyncio.run(failures(relay.url, limit))} of 20 requests "
                  "sent 4.990-5.010 s apart failed unanswered")
    finally:
        relay.close()
        engine.stop()


if __name__ == "__main__":
    main()
