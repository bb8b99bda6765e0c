"""A LiteLLM proxy hook: every model behind the gateway gets long prompts compressed by ilre first.

In the proxy's config.yaml (the module-level `compression` reads its settings from ILRE_LITELLM_*):

    litellm_settings:
      callbacks: ilre.integrations.litellm.compression

    ILRE_LITELLM_TARGET=127.0.0.1:50051   # an ilre service (gRPC, or http://...); unset = in process (needs ilre[server])
    ILRE_LITELLM_BUDGET=1024  ILRE_LITELLM_STRICT=0  ILRE_LITELLM_TIMEOUT_S=30  ILRE_API_KEY=...
    ILRE_LITELLM_GRANULARITY=unit         # keep whole sentences, lines, records (unset: the service's default)

or a file of your own beside config.yaml, `callbacks: my_hooks.ilre` with
`ilre = IlreCompression(target="127.0.0.1:50051", budget=2048, strict=True)`.

What is compressed: chat messages (`messages`) and completion prompts (`prompt`) longer than the budget.
- A chat follows contract/chat.py, the rules the gateway and the sidecar follow too, through the same code
  (service/transport/chat_compression.py: each message a document of its own, so the next call carrying
  it resumes its encoding): the query ILRe ranks by is
  the last user message (its last QUERY_TOKENS tokens, which stay whole, when it is documents before
  a question); earlier user messages, tool and function results (text content: a string or text
  parts), system and developer messages over LONG_INSTRUCTIONS tokens and the rest of a long last
  user message are compressed, each to its share of what the messages kept whole leave of the budget
  (in proportion to its tokens). Assistant messages, shorter instructions, messages up to a
  `cache_control` breakpoint, short messages and messages with images, audio or files stay as they
  are, as do tools and tool calls.
- A completion prompt is compressed by its own end (its last QUERY_TOKENS tokens are the query).
- A prompt that fits the budget passes untouched.
The facts land in the response headers (`x-ilre-action`: compressed, passthrough or failed;
`x-ilre-original-tokens`, `x-ilre-compressed-tokens`, `x-ilre-reason`) and in the request's metadata
under "ilre". If ilre fails or times out the call goes on uncompressed (logged, counted in `failures`,
`x-ilre-action: failed`), unless `strict`: then the caller gets 503 naming the cause.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Any, Mapping

from litellm.integrations.custom_logger import CustomLogger

from ..contract.chat import split_chat
from ..contract.conversation import NotReadable, read_conversation
from ..contract.defaults import DEFAULT_BUDGET, QUERY_TOKENS
from ..contract.messages import CompressResult, GRANULARITIES
from ..service.transport.chat_compression import compress_chat
from .backend import Backend, chosen, compress_by_its_end, count_tokens

log = logging.getLogger(__name__)

CHAT_CALLS = ("completion", "acompletion")
TEXT_CALLS = ("text_completion", "atext_completion")


@dataclass
class Outcome:
    """What the hook did with one request (its headers and metadata)."""

    action: str
    original_tokens: int | None = None
    compressed_tokens: int | None = None
    reason: str | None = None

    def headers(self) -> dict[str, str]:
        out = {"x-ilre-action": self.action}
        if self.original_tokens is not None:
            out.update({"x-ilre-original-tokens": str(self.original_tokens),
                        "x-ilre-compressed-tokens": str(self.compressed_tokens)})
        if self.reason:
            out["x-ilre-reason"] = " ".join(self.reason.split())[:200]
        return out


class IlreCompression(CustomLogger):
    """target: None = in process (the embedded model), "HOST:PORT" = an ilre service's gRPC API,
    "http(s)://HOST:PORT" its HTTP API; budget: prompt tokens to aim for (the model's tokens); strategy:
    an ilre strategy (None: the default); strict: a failure of ilre fails the call (503) instead of
    sending the prompt uncompressed; timeout_s: per ilre request; granularity: "token" or "unit" (whole
    sentences, lines, records; None: the service's default)."""

    def __init__(self, target: str | None = None, budget: int = DEFAULT_BUDGET, strategy: str | None = None,
                 strict: bool = False, timeout_s: float = 30.0, api_key: str | None = None,
                 granularity: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        if not isinstance(budget, int) or budget <= 2 * QUERY_TOKENS:
            raise ValueError(f"budget: must be an integer above {2 * QUERY_TOKENS} (got {budget!r})")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s: must be > 0 (got {timeout_s!r})")
        if granularity is not None and granularity not in GRANULARITIES:
            raise ValueError(f"granularity: must be one of {', '.join(GRANULARITIES)} (got {granularity!r})")
        self.backend = Backend(target, api_key, timeout_s)
        self.budget, self.strategy, self.strict, self.timeout_s = budget, strategy, strict, timeout_s
        self.granularity = granularity
        self.failures = 0  # calls that went on uncompressed because ilre failed

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> "IlreCompression":
        """Settings from ILRE_LITELLM_TARGET, _BUDGET, _STRATEGY, _STRICT, _TIMEOUT_S, _GRANULARITY and ILRE_API_KEY."""
        def get(name: str) -> str | None:
            return environ.get(f"ILRE_LITELLM_{name}") or None

        try:
            return cls(target=get("TARGET"), budget=int(get("BUDGET") or DEFAULT_BUDGET), strategy=get("STRATEGY"),
                       strict=(get("STRICT") or "0").lower() in ("1", "true", "yes", "on"),
                       timeout_s=float(get("TIMEOUT_S") or 30.0), api_key=environ.get("ILRE_API_KEY") or None,
                       granularity=get("GRANULARITY"))
        except ValueError as exc:
            raise ValueError(f"ILRE_LITELLM_{str(exc).split(':')[0].upper()}: {exc}") from None

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict, call_type: str) -> dict:
        """Before the call: the request with its long prompt compressed (or as it came, with the reason)."""
        if call_type not in CHAT_CALLS + TEXT_CALLS:
            return data
        try:
            outcome = await asyncio.wait_for(asyncio.to_thread(self._compress, data), self.timeout_s)
        except Exception as exc:  # ilre down, timed out or refusing: the call goes on as it came, unless strict
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if self.strict:
                from fastapi import HTTPException

                raise HTTPException(status_code=503, detail=f"ilre: compression failed ({reason})") from None
            self.failures += 1
            log.warning("ilre: compression failed, the call goes on uncompressed (%s); %d so far", reason, self.failures)
            outcome = Outcome("failed", reason=reason)
        metadata = data.get("metadata")
        if not isinstance(metadata, dict):
            metadata = data["metadata"] = {}
        metadata["ilre"] = outcome.headers()
        return data

    async def async_post_call_response_headers_hook(self, data: dict, user_api_key_dict: Any, response: Any,
                                                    request_headers: Any = None, **kwargs: Any) -> dict[str, str] | None:
        """The x-ilre-* headers of what the pre-call hook did."""
        facts = (data.get("metadata") or {}).get("ilre") if isinstance(data, dict) else None
        return dict(facts) if facts else None

    # -- compression (runs in a worker thread: the backend's calls block) -----------------------------------
    def _compress(self, data: dict) -> Outcome:
        if isinstance(data.get("messages"), list):
            return self._compress_chat(data)
        prompt = data.get("prompt")
        if isinstance(prompt, str) and prompt:
            if len(prompt.encode()) <= self.budget:
                return Outcome("passthrough", reason="fits the budget")
            length, ids = count_tokens(self.backend, prompt)
            if length <= self.budget:
                return Outcome("passthrough", length, length, "fits the budget")
            short = compress_by_its_end(self.backend, prompt, self.budget, self.strategy, ids, self.granularity)
            data["prompt"] = short.text
            return Outcome("compressed", short.original_tokens, short.kept_tokens)
        return Outcome("passthrough", reason="no single text prompt")

    def _compress_chat(self, data: dict) -> Outcome:
        """The chat compressed message by message (service/transport/chat_compression.py, the path the gateway
        and the sidecar take): each compressed message a document of its own, so the next call carrying it
        (an agent's next step) resumes its encoding."""
        try:
            conversation = read_conversation("openai.chat", {"messages": data["messages"]})
        except NotReadable as exc:
            return Outcome("passthrough", reason=f"not readable: {exc}")
        split = split_chat(conversation.messages)
        if split.query is None:
            return Outcome("passthrough", reason="no user message with text")
        if len(split.whole_chat().encode()) <= self.budget:  # a token is at least a byte: no need to ask
            return Outcome("passthrough", reason="fits the budget")
        done = asyncio.run(compress_chat(self._call, conversation.messages, lambda _: self.budget,
                                         fields=chosen(self.strategy, self.granularity)))
        if not done.compressed:
            reason = "fits the budget" if done.before <= self.budget else "no compressible message"
            return Outcome("passthrough", done.before, done.before, reason)
        texts = {c.index: c.text for c in done.compressed}
        data["messages"] = conversation.write({"messages": data["messages"]}, texts)["messages"]
        return Outcome("compressed", done.before, done.after)

    async def _call(self, fields: dict[str, Any]) -> CompressResult:
        """One contract request through the backend (blocking: this runs on the hook's worker thread)."""
        return self.backend.compress(**fields)


compression = IlreCompression.from_env(os.environ)  # `callbacks: ilre.integrations.litellm.compression`
