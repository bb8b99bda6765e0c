"""The options both framework adapters take (a pydantic mixin: LangChain's and LlamaIndex's base
classes are pydantic models), and the DocumentCompression they build from them."""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, PrivateAttr

from .backend import QUERY_TEMPLATE, DocumentCompression


class CompressionOptions(BaseModel):
    """target: "HOST:PORT" (gRPC), "http://HOST:PORT" (HTTP) or None (in process, embedded model);
    ratio (default 0.3 per document) or budget (tokens over all documents); strategy (None: the
    server's default); granularity: "token" or "unit" (whole sentences, lines, records; None: the
    server's default); api_key."""

    target: Optional[str] = None
    ratio: Optional[float] = None
    budget: Optional[int] = None
    strategy: Optional[str] = None  # None: the server's default
    query_template: str = QUERY_TEMPLATE
    api_key: Optional[str] = None
    timeout_s: float = 300.0
    granularity: Optional[str] = None  # None: the server's default
    _backend: DocumentCompression = PrivateAttr()

    def model_post_init(self, context: Any) -> None:
        self._backend = DocumentCompression(self.target, self.ratio, self.budget, self.strategy, self.query_template,
                                            self.api_key, self.timeout_s, self.granularity)
