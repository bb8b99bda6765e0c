"""LlamaIndex: `IlrePostprocessor`, a `BaseNodePostprocessor` for query engines and retrievers.

    from ilre.integrations.llamaindex import IlrePostprocessor
    engine = index.as_query_engine(node_postprocessors=[IlrePostprocessor(target="127.0.0.1:50051")])

Each node keeps its id, metadata, relationships and score; its text becomes the kept text and
`metadata["ilre"]` records the compression (token counts, ratio, strategy, layer, document_id,
granularity; with units kept_spans).
"""

from __future__ import annotations

from typing import Optional

from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle

from .backend import compression_metadata
from .options import CompressionOptions


class IlrePostprocessor(CompressionOptions, BaseNodePostprocessor):
    """Options: see CompressionOptions (target, ratio | budget, strategy, granularity, query_template, api_key)."""

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
