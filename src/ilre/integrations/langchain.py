"""LangChain: `IlreCompressor`, a `BaseDocumentCompressor` for `ContextualCompressionRetriever`.

    from ilre.integrations.langchain import IlreCompressor
    compressor = IlreCompressor(target="127.0.0.1:50051", ratio=0.3)   # or target=None: in process
    retriever = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=retriever)

Each retrieved document comes back with its kept text as page_content, its metadata as it was plus
`metadata["ilre"]` (token counts, ratio, strategy, layer, document_id, granularity; with units
kept_spans); order is kept.
"""

from __future__ import annotations

from typing import Optional, Sequence

from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from pydantic import ConfigDict

from .backend import compression_metadata
from .options import CompressionOptions


class IlreCompressor(CompressionOptions, BaseDocumentCompressor):
    """Options: see CompressionOptions (target, ratio | budget, strategy, granularity, query_template, api_key)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    def compress_documents(self, documents: Sequence[Document], query: str,
                           callbacks: Optional[Callbacks] = None) -> Sequence[Document]:
        results = self._backend.compress([d.page_content for d in documents], query)
        out = []
        for document, result in zip(documents, results):
            if result is None:
                out.append(document)
                continue
            metadata = {**document.metadata, "ilre": compression_metadata(result)}
            out.append(Document(page_content=result.compressed_context, metadata=metadata, id=document.id))
        return out
