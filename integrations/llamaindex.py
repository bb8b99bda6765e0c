"""LlamaIndex: `IlrePostprocessor`, a `BaseNodePostprocessor` for query engines and retrievers.

    from ilre.integrations.llamaindex import IlrePostprocessor
    engine = index.as_query_engine(node_postprocessors=[IlrePostprocessor(target="127.0.0.1:50051")])

Each node keeps its id, metadata, relationships and score; its text becomes the kept text and
`metadata["ilre"]` records the compression (token counts, ratio, strategy, layer, document_id).
"""

from __future__ import annotations

from typing import Any, Optional

from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle

from .backend import QUERY_TEMPLATE, DocumentCompression, compression_metadata


class IlrePostprocessor(BaseNodePostprocessor):
    """target: "HOST:PORT" (gRPC), "http://HOST:PORT" (HTTP) or None (in process, embedded model);
    ratio (default 0.3 per node) or budget (tokens over all nodes); strategy; api_key."""

    target: Optional[str] = None
    ratio: Optional[float] = None
    budget: Optional[int] = None
    strategy: str = "ilre"
    query_template: str = QUERY_TEMPLATE
    api_key: Optional[str] = None
    timeout_s: float = 300.0
    _backend: DocumentCompression = PrivateAttr()

    def model_post_init(self, context: Any) -> None:
        self._backend = DocumentCompression(self.target, self.ratio, self.budget, self.strategy, self.query_template,
                                            self.api_key, self.timeout_s)

    @classmethod
    def class_name(cls) -> str:
        return "IlrePostprocessor"

    def _postprocess_nodes(self, nodes: list[NodeWithScore],
                           query_bundle: Optional[QueryBundle] = None) -> list[NodeWithScore]:
        if query_bundle is None:
            raise ValueError("query_bundle: IlrePostprocessor compresses for a query; none was given")
        results = self._backend.compress([n.node.get_content() for n in nodes], query_bundle.query_str)
        out = []
        for item, result in zip(nodes, results):
            if result is None:
                out.append(item)
                continue
            node = item.node.model_copy(deep=True)
            node.set_content(result.compressed_context)
            node.metadata["ilre"] = compression_metadata(result)
            out.append(NodeWithScore(node=node, score=item.score))
        return out
