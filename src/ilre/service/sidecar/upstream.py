"""The upstream: the inference engine behind the sidecar (SGLang, vLLM, llama.cpp; "the engine" in the
sidecar's options and messages, apart from ilre's own Engine): one pooled HTTP client, requests opened as
streams, transport failures mapped to one error type (UpstreamError), and the start-up check that the
engine's tokenizer is ours.

Failures: cannot connect -> 502; the connection breaks -> 502 (a kept-alive one the engine closed
just as it was reused: the request goes again on a new one); no answer (headers, or the next body
chunk) within the deadline -> 504. The engine's own error answers are not failures here: they are
relayed with their status and body.

UpstreamHealth asks the engine's `GET /health` (SGLang, vLLM and llama.cpp all serve it) every few
seconds; the sidecar's /ilre/readyz is ready only while the latest answer was a recent 200.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, AsyncIterator, Mapping

import httpx

log = logging.getLogger(__name__)

# headers that belong to one connection, not to the request (RFC 9110 7.6.1), and ours
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "transfer-encoding", "upgrade", "host", "content-length"})
# the engine's own response headers the sidecar's server sets itself (relayed, each would appear twice)
OWN_RESPONSE_HEADERS = frozenset({"date", "server"})
# an idle pooled connection is dropped after this long: well before the engines' own keep-alive
# timeout (5 s in llama.cpp's server and in uvicorn, which serves vLLM and SGLang). A connection
# reused just as the engine closes it fails with no answer (bench/engine_connections.py counts how
# often, for requests sent 4.990-5.010 s apart; httpx's default expiry is the same 5 s)
IDLE_CONNECTION_S = 2.0
# a request whose kept-alive connection was closed under it goes again this many times at most
STALE_RETRIES = 2
PROBE_TEXT = "Tokenizer probe: naïve café, 1234567 <tag> {\"json\": [1, 2]}\n\tend."


class UpstreamError(Exception):
    """The engine could not be reached or did not answer in time; `status` is 502 or 504."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class ConnectionUse:
    """Whether one request opened a new connection or went on a kept-alive one (httpx's `trace`
    request extension reports each step of a request; opening a TCP connection is one of them)."""

    def __init__(self) -> None:
        self.opened = False

    async def trace(self, event: str, info: dict[str, Any]) -> None:
        if event == "connection.connect_tcp.started":
            self.opened = True


class Upstream:
    """One engine at `base_url`; `api` (sglang | openai | llamacpp) picks its tokenize endpoint."""

    def __init__(self, base_url: str, api: str, connect_timeout_s: float = 5.0, max_connections: int = 256):
        self.base_url = base_url.rstrip("/")
        self.api = api
        self.connect_timeout_s = connect_timeout_s
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=32,
                              keepalive_expiry=IDLE_CONNECTION_S)
        self.client = httpx.AsyncClient(base_url=self.base_url, limits=limits, trust_env=False,
                                        timeout=httpx.Timeout(None, connect=connect_timeout_s, pool=connect_timeout_s))

    async def open(self, method: str, path: str, query: str, headers: Mapping[str, str], content: Any,
                   timeout_s: float) -> httpx.Response:
        """Send a request and return the engine's response with its body not yet read; UpstreamError
        when the engine is unreachable or sends no headers within `timeout_s`.

        A kept-alive connection that the engine closes just as it is reused fails with no answer
        (llama.cpp's server closes one right after each streamed answer; any engine at its idle
        timeout). The engine never read that request, so it goes again on another connection, up to
        STALE_RETRIES times; a new connection closed unanswered is a failure. Only a body given as
        bytes is sent again: a client's body stream is read once."""
        deadline = time.monotonic() + timeout_s
        replayable = content is None or isinstance(content, (bytes, bytearray))
        resent = 0
        while True:
            connection = ConnectionUse()
            try:
                return await self._send(method, path, query, headers, content, deadline, connection)
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
                if connection.opened or not replayable or resent == STALE_RETRIES:
                    raise UpstreamError(502, f"engine: {self.base_url} closed the connection ({_reason(exc)})") from None
                resent += 1
                log.debug("engine %s: a kept-alive connection was closed under %s %s; sending it again", self.base_url,
                          method, path)

    async def _send(self, method: str, path: str, query: str, headers: Mapping[str, str], content: Any,
                    deadline: float, connection: ConnectionUse) -> httpx.Response:
        """One attempt of `open` on a pooled connection; transport errors other than timeouts and
        refused connections are raised as they are."""
        timeout_s = max(deadline - time.monotonic(), 0.001)
        request = self.client.build_request(method, path + (f"?{query}" if query else ""), headers=forward_headers(headers),
                                            content=content, extensions={"trace": connection.trace},
                                            timeout=httpx.Timeout(timeout_s, connect=min(self.connect_timeout_s, timeout_s)))
        try:
            return await asyncio.wait_for(self.client.send(request, stream=True), timeout_s)
        except (asyncio.TimeoutError, httpx.TimeoutException) as exc:
            if isinstance(exc, httpx.ConnectTimeout):
                raise UpstreamError(502, f"engine: no connection to {self.base_url} within {self.connect_timeout_s:g} s") from None
            raise UpstreamError(504, f"engine: {self.base_url} did not answer {method} {path} within {timeout_s:.1f} s, "
                                   "the time left before the request's deadline (x-request-timeout, else "
                                   "--engine-timeout)") from None
        except httpx.ConnectError as exc:
            raise UpstreamError(502, f"engine: cannot connect to {self.base_url} ({_reason(exc)})") from None

    async def body(self, response: httpx.Response, decoded: bool = False) -> AsyncIterator[bytes]:
        """The response body as it arrives: the bytes as sent, or content-decoded (for rewriting).
        The upstream request is closed when the iteration ends or is abandoned (client gone)."""
        try:
            async for chunk in (response.aiter_bytes() if decoded else response.aiter_raw()):
                yield chunk
        except httpx.TimeoutException:
            log.warning("engine %s: body stalled past the deadline; stream cut", self.base_url)
        except httpx.HTTPError as exc:
            log.warning("engine %s: stream broke: %s", self.base_url, _reason(exc))
        finally:
            await response.aclose()

    async def health(self, timeout_s: float) -> str | None:
        """None when the engine's GET /health answers 200 within `timeout_s`, else what went wrong."""
        try:
            response = await self.open("GET", "/health", "", {}, None, timeout_s)
        except UpstreamError as exc:
            return exc.message if exc.status != 504 else f"engine: {self.base_url}/health did not answer within {timeout_s:g} s"
        try:
            await response.aread()
        except httpx.HTTPError as exc:
            return f"engine: {self.base_url}/health broke off ({_reason(exc)})"
        finally:
            await response.aclose()
        if response.status_code != 200:
            return f"engine: {self.base_url}/health answered {response.status_code}"
        return None

    async def tokenize(self, text: str, timeout_s: float = 10.0) -> list[int] | None:
        """The engine's token IDs for `text`, no special tokens added (its /tokenize endpoint);
        None when it answers without them; UpstreamError when it cannot be reached."""
        payload = ({"content": text, "add_special": False} if self.api == "llamacpp"
                   else {"prompt": text, "add_special_tokens": False})
        response = await self.open("POST", "/tokenize", "", {"content-type": "application/json"},
                                   json.dumps(payload).encode(), timeout_s)
        try:
            await response.aread()
        finally:
            await response.aclose()
        try:
            tokens = response.json().get("tokens") if response.status_code == 200 else None
        except (ValueError, AttributeError):
            tokens = None
        if not isinstance(tokens, list):
            return None
        return [t.get("id") if isinstance(t, dict) else t for t in tokens]

    async def close(self) -> None:
        await self.client.aclose()


def forward_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The client's headers as the engine should see them: no hop-by-hop headers, none of ilre's."""
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP and not k.lower().startswith("x-ilre-")}


def response_headers(response: httpx.Response, rewritten: bool) -> dict[str, str]:
    """The engine's response headers to relay; a body the sidecar rewrites loses its length/encoding."""
    drop = HOP_BY_HOP | OWN_RESPONSE_HEADERS | ({"content-encoding"} if rewritten else set())
    return {k: v for k, v in response.headers.items() if k.lower() not in drop}


class UpstreamHealth:
    """The engine's health as last seen: `run()` asks `upstream.health` every `interval_s`, each
    check allowed `timeout_s` (SGLang's /health queues a one-token generation behind the running
    batch and gives it 20 s itself: a long prefill on a CPU holds it for seconds). Healthy means the
    latest finished check answered 200 no longer ago than three intervals plus one timeout (a check
    in flight keeps the previous verdict until then)."""

    def __init__(self, upstream: Upstream, interval_s: float, timeout_s: float = 20.0):
        self.upstream, self.interval_s, self.timeout_s = upstream, interval_s, timeout_s
        self.checked_at: float | None = None  # time.monotonic() of the latest finished check
        self.cause: str | None = "not checked yet"

    @property
    def healthy(self) -> bool:
        fresh = self.checked_at is not None and time.monotonic() - self.checked_at <= 3 * self.interval_s + self.timeout_s
        return fresh and self.cause is None

    async def check(self) -> bool:
        """One check now; True when the engine answered 200."""
        cause = await self.upstream.health(self.timeout_s)
        if cause != self.cause:
            if cause is None:
                log.info("engine %s: healthy", self.upstream.base_url)
            else:
                log.warning("engine %s: not healthy: %s", self.upstream.base_url, cause)
        self.cause, self.checked_at = cause, time.monotonic()
        return cause is None

    async def run(self) -> None:
        """Check now, then every `interval_s` until cancelled."""
        while True:
            started = time.monotonic()
            await self.check()
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))

    def report(self) -> dict[str, object]:
        """The state for /ilre/readyz."""
        ago = None if self.checked_at is None else round(time.monotonic() - self.checked_at, 3)
        return {"url": self.upstream.base_url, "healthy": self.healthy, "checked_s_ago": ago, "cause": self.cause}


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return text or type(exc).__name__
