"""The engine behind the sidecar: one pooled HTTP client, requests opened as streams, transport
failures mapped to one error type, and the start-up check that the engine's tokenizer is ours.

Failures: cannot connect -> 502; the connection breaks -> 502; no answer (headers, or the next body
chunk) within the deadline -> 504. The engine's own error answers are not failures here: they are
relayed with their status and body.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, AsyncIterator, Mapping

import httpx

log = logging.getLogger(__name__)

# headers that belong to one connection, not to the request (RFC 9110 7.6.1), and ours
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "transfer-encoding", "upgrade", "host", "content-length"})
PROBE_TEXT = "Tokenizer probe: naïve café, 1234567 <tag> {\"json\": [1, 2]}\n\tend."


class EngineError(Exception):
    """The engine could not be reached or did not answer in time; `status` is 502 or 504."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class Upstream:
    """One engine at `base_url`; `api` (sglang | openai | llamacpp) picks its tokenize endpoint."""

    def __init__(self, base_url: str, api: str, connect_timeout_s: float = 5.0, max_connections: int = 256):
        self.base_url = base_url.rstrip("/")
        self.api = api
        self.connect_timeout_s = connect_timeout_s
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=32)
        self.client = httpx.AsyncClient(base_url=self.base_url, limits=limits, trust_env=False,
                                        timeout=httpx.Timeout(None, connect=connect_timeout_s, pool=connect_timeout_s))

    async def open(self, method: str, path: str, query: str, headers: Mapping[str, str], content: Any,
                   timeout_s: float) -> httpx.Response:
        """Send a request and return the engine's response with its body not yet read; EngineError
        when the engine is unreachable or sends no headers within `timeout_s`."""
        url = path + (f"?{query}" if query else "")
        request = self.client.build_request(method, url, headers=forward_headers(headers), content=content,
                                            timeout=httpx.Timeout(timeout_s, connect=min(self.connect_timeout_s, timeout_s)))
        try:
            return await asyncio.wait_for(self.client.send(request, stream=True), timeout_s)
        except (asyncio.TimeoutError, httpx.TimeoutException) as exc:
            if isinstance(exc, httpx.ConnectTimeout):
                raise EngineError(502, f"engine: no connection to {self.base_url} within {self.connect_timeout_s:g} s") from None
            raise EngineError(504, f"engine: {self.base_url} did not answer {method} {path} within {timeout_s:.1f} s, "
                                   "the time left before the request's deadline (x-request-timeout, else "
                                   "--engine-timeout)") from None
        except httpx.ConnectError as exc:
            raise EngineError(502, f"engine: cannot connect to {self.base_url} ({_reason(exc)})") from None
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            raise EngineError(502, f"engine: {self.base_url} closed the connection ({_reason(exc)})") from None

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

    async def tokenize(self, text: str, timeout_s: float = 10.0) -> list[int] | None:
        """The engine's token IDs for `text`, no special tokens added (its /tokenize endpoint);
        None when it answers without them; EngineError when it cannot be reached."""
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
    drop = HOP_BY_HOP | ({"content-encoding"} if rewritten else set())
    return {k: v for k, v in response.headers.items() if k.lower() not in drop}


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return text or type(exc).__name__
