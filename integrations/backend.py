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

from ..service.api.messages import CompressRequest, CompressResult

QUERY_TEMPLATE = "\nQuestion: {query}\nAnswer:"


@dataclass
class DocumentCompression:
    """ratio: kept share of each document (default 0.3) unless `budget` (context tokens over all the
    documents) is given; strategy: a strategy name (None: the server's default, the cascade); query_template: how the user's
    question becomes ILRe's query (question plus answer prefix)."""

    target: str | None = None
    ratio: float | None = None
    budget: int | None = None
    strategy: str | None = None
    query_template: str = QUERY_TEMPLATE
    api_key: str | None = None
    timeout_s: float = 300.0
    _engine: Any = field(default=None, repr=False)

    def compress(self, texts: list[str], query: str) -> list[CompressResult | None]:
        """One result per text, in order (None for an empty text, which has nothing to compress)."""
        shares = self._shares(texts)
        question = self.query_template.format(query=query)
        results: list[CompressResult | None] = []
        for text, share in zip(texts, shares):
            if not text.strip():
                results.append(None)
                continue
            fields: dict[str, Any] = {"context": text, "query": question, **share}
            if self.strategy is not None:
                fields["strategy"] = self.strategy
            results.append(self._send(fields))
        return results

    def _shares(self, texts: list[str]) -> list[dict[str, Any]]:
        if self.budget is None:
            return [{"ratio": self.ratio if self.ratio is not None else 0.3}] * len(texts)
        total = sum(len(t) for t in texts) or 1
        return [{"budget": max(1, math.floor(self.budget * len(t) / total))} for t in texts]

    def _send(self, fields: dict[str, Any]) -> CompressResult:
        if self.target is None:
            if self._engine is None:
                from ..service.api.engine import Engine

                self._engine = Engine()
            return self._engine.compress(CompressRequest(**fields))
        if self.target.startswith(("http://", "https://")):
            import httpx

            headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            reply = httpx.post(f"{self.target.rstrip('/')}/v1/compress", json=fields, headers=headers,
                               timeout=self.timeout_s)
            if reply.status_code != 200:
                raise RuntimeError(f"ilre {self.target}: {reply.status_code} {reply.json().get('error', reply.text)}")
            return CompressResult(**reply.json())
        from ..service.client import Client

        with Client(self.target, api_key=self.api_key, timeout=self.timeout_s) as client:
            return client.compress(**fields)


def compression_metadata(result: CompressResult) -> dict[str, Any]:
    """What an adapter records in each compressed document's metadata under "ilre"."""
    return {"original_tokens": result.original_tokens, "compressed_tokens": result.compressed_tokens,
            "ratio": result.ratio, "strategy": result.strategy, "layer": result.layer,
            "document_id": result.document_id}
