"""What both framework adapters share: compress retrieved texts for one query through ilre.

`target` picks where: "HOST:PORT" = a running service's gRPC API, "http://HOST:PORT" (or https) =
its HTTP JSON API, None = an in-process Engine on the embedded model (loaded on first use). Each
document is compressed on its own (its boundaries and metadata stay exactly as they were) with the
same query and its share of the budget: `ratio` of its tokens, or a total `budget` split across the
documents in proportion to their lengths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..contract.defaults import QUERY_TOKENS
from ..contract.messages import CompressRequest, CompressResult, NotFoundError

QUERY_TEMPLATE = "\nQuestion: {query}\nAnswer:"


@dataclass
class Backend:
    """Where a compression runs: `target` None = an in-process Engine (`model`: a checkpoint folder,
    .gguf or hub id; None = the embedded default), "HOST:PORT" = a service's gRPC API, "http(s)://HOST:PORT"
    = its HTTP JSON API. Bad input raises ValueError naming the field, and a document_id the service does not
    hold NotFoundError, whichever the target."""

    target: str | None = None
    api_key: str | None = None
    timeout_s: float = 300.0
    model: str | None = None
    _engine: Any = field(default=None, repr=False)
    _client: Any = field(default=None, repr=False)

    def compress(self, **fields: Any) -> CompressResult:
        """One CompressRequest's fields (context or context_ids, query, budget or ratio, strategy...) -> its result."""
        if self.target is None:
            if self._engine is None:
                from ..engine.engine import Engine, EngineConfig

                self._engine = Engine(EngineConfig(model=self.model))
            return self._engine.compress(CompressRequest(**fields))
        if self.target.startswith(("http://", "https://")):
            import httpx

            headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            reply = httpx.post(f"{self.target.rstrip('/')}/v1/compress", json=fields, headers=headers,
                               timeout=self.timeout_s)
            if reply.status_code == 400:
                raise ValueError(reply.json().get("error", reply.text))
            if reply.status_code == 404:  # a document_id the service no longer holds, as in process
                raise NotFoundError("document_id", reply.json().get("error", reply.text))
            if reply.status_code != 200:
                raise RuntimeError(f"ilre {self.target}: {reply.status_code} {reply.json().get('error', reply.text)}")
            return CompressResult(**reply.json())
        from ..service.client import Client, ClientError

        if self._client is None:  # one channel for every call (gRPC channels are thread-safe)
            self._client = Client(self.target, api_key=self.api_key, timeout=self.timeout_s)
        try:
            return self._client.compress(**fields)
        except ClientError as exc:
            if exc.code == "INVALID_ARGUMENT":
                raise ValueError(exc.message) from None
            if exc.code == "NOT_FOUND":
                raise NotFoundError("document_id", exc.message) from None
            raise


@dataclass(frozen=True)
class Shortened:
    """A text compressed by its own end: the new text, and its size before and after, in the model's tokens."""

    text: str
    original_tokens: int
    kept_tokens: int


def count_tokens(backend: Backend, text: str, query: str = ".") -> tuple[int, list[int]]:
    """(tokens, token IDs) of `text` in the model's tokenizer, by a pass-through request (ratio 1)."""
    whole = backend.compress(context=text, query=query, ratio=1.0)
    return whole.original_tokens, whole.token_ids[:whole.original_tokens]


def chosen(strategy: str | None = None, granularity: str | None = None) -> dict[str, Any]:
    """The request fields an adapter's strategy and granularity set (None: the server's default)."""
    return {name: value for name, value in (("strategy", strategy), ("granularity", granularity)) if value is not None}


def compress_by_its_end(backend: Backend, text: str, target: int, strategy: str | None = None,
                        ids: list[int] | None = None, granularity: str | None = None) -> Shortened:
    """A prompt with no separate question, cut to `target` tokens: its last QUERY_TOKENS tokens are the
    query ILRe ranks by and stay whole (ILRe's LongBench rule, the sidecar's for plain prompts), the rest
    is compressed to the remaining budget. `ids`: the text's token IDs when already known."""
    if ids is None:
        _, ids = count_tokens(backend, text)
    if len(ids) <= QUERY_TOKENS or target >= len(ids):
        return Shortened(text, len(ids), len(ids))
    result = backend.compress(context_ids=ids[:-QUERY_TOKENS], query_ids=ids[-QUERY_TOKENS:],
                              budget=max(1, target - QUERY_TOKENS), **chosen(strategy, granularity))
    return Shortened(result.compressed_context + result.query, len(ids), result.compressed_tokens + QUERY_TOKENS)


@dataclass
class DocumentCompression:
    """ratio: kept share of each document (default 0.3) unless `budget` (context tokens over all the
    documents) is given; strategy: a strategy name (None: the server's default, the cascade); query_template: how the user's
    question becomes ILRe's query (question plus answer prefix); granularity: "token" or "unit" (whole sentences,
    lines, records; None: the server's default)."""

    target: str | None = None
    ratio: float | None = None
    budget: int | None = None
    strategy: str | None = None
    query_template: str = QUERY_TEMPLATE
    api_key: str | None = None
    timeout_s: float = 300.0
    granularity: str | None = None
    _backend: Backend = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._backend = Backend(self.target, self.api_key, self.timeout_s)

    def compress(self, texts: list[str], query: str) -> list[CompressResult | None]:
        """One result per text, in order (None for an empty text, which has nothing to compress)."""
        shares = self._shares(texts)
        question = self.query_template.format(query=query)
        results: list[CompressResult | None] = []
        for text, share in zip(texts, shares):
            if not text.strip():
                results.append(None)
                continue
            fields: dict[str, Any] = {"context": text, "query": question, **share,
                                      **chosen(self.strategy, self.granularity)}
            results.append(self._backend.compress(**fields))
        return results

    def _shares(self, texts: list[str]) -> list[dict[str, Any]]:
        if self.budget is None:
            return [{"ratio": self.ratio if self.ratio is not None else 0.3}] * len(texts)
        total = sum(len(t) for t in texts) or 1
        return [{"budget": max(1, math.floor(self.budget * len(t) / total))} for t in texts]


def compression_metadata(result: CompressResult) -> dict[str, Any]:
    """What an adapter records in each compressed document's metadata under "ilre" (with units also
    `kept_spans`: the [start, end) characters of each kept unit in the original text)."""
    info = {"original_tokens": result.original_tokens, "compressed_tokens": result.compressed_tokens,
            "ratio": result.ratio, "strategy": result.strategy, "layer": result.layer,
            "document_id": result.document_id, "granularity": result.granularity}
    if result.kept_spans is not None:
        info["kept_spans"] = result.kept_spans
    return info
