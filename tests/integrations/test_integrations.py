"""The framework adapters in short retrieval pipelines against a real ilre server on loopback:
LangChain's document compressor over gRPC and HTTP, LlamaIndex's node postprocessor over gRPC and
in process. The answer-bearing sentence survives, boundaries, order and metadata are kept."""

from __future__ import annotations

import pytest
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableLambda
from llama_index.core import SummaryIndex
from llama_index.core.schema import NodeWithScore, TextNode

from ilre.evaluation.tasks.haystack import shakespeare_text
from ilre.integrations.langchain import IlreCompressor
from ilre.integrations.llamaindex import IlrePostprocessor

from tests.service.conftest import assert_whole_lines, lines_context

ANSWER = "The vault code of the museum is 4471."
QUESTION = "What is the vault code of the museum?"


def passages() -> list[str]:
    """Four retrieved passages of Shakespeare (~700 tokens each); the third holds the answer."""
    text = shakespeare_text()
    chunks = [text[i * 3000:(i + 1) * 3000] for i in range(4)]
    chunks[2] = chunks[2][:1500] + " " + ANSWER + " " + chunks[2][1500:]
    return chunks


class ListRetriever(BaseRetriever):
    """Returns the fixed passages (the retrieval step is not what is tested)."""

    documents: list[Document]

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return self.documents


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_langchain_pipeline_keeps_the_answer(local_service, transport):
    target = (f"127.0.0.1:{local_service.grpc_port}" if transport == "grpc"
              else f"http://127.0.0.1:{local_service.http_port}")
    documents = [Document(page_content=p, metadata={"source": f"doc{i}"}, id=f"d{i}") for i, p in enumerate(passages())]
    compressor = IlreCompressor(target=target, ratio=0.25)
    chain = ListRetriever(documents=documents) | RunnableLambda(lambda docs: compressor.compress_documents(docs, QUESTION))
    out = chain.invoke(QUESTION)
    assert [d.id for d in out] == [d.id for d in documents]
    assert [d.metadata["source"] for d in out] == [d.metadata["source"] for d in documents]
    assert ANSWER in out[2].page_content
    for before, after in zip(documents, out):
        info = after.metadata["ilre"]
        assert info["compressed_tokens"] == -(-info["original_tokens"] // 4)  # ceil(0.25 x tokens)
        assert len(after.page_content) < len(before.page_content)


def test_langchain_budget_is_split_over_the_documents(local_service):
    documents = [Document(page_content=p) for p in passages()]
    out = IlreCompressor(target=f"127.0.0.1:{local_service.grpc_port}", budget=800).compress_documents(documents, QUESTION)
    kept = [d.metadata["ilre"]["compressed_tokens"] for d in out]
    assert sum(kept) <= 800 and min(kept) >= 150 and ANSWER in out[2].page_content


@pytest.mark.parametrize("where", ["grpc", "in-process"])
def test_llamaindex_pipeline_keeps_the_answer(local_service, where):
    nodes = [TextNode(text=p, id_=f"n{i}", metadata={"page": i}) for i, p in enumerate(passages())]
    retrieved = SummaryIndex(nodes).as_retriever().retrieve(QUESTION)  # every node, in order
    target = f"127.0.0.1:{local_service.grpc_port}" if where == "grpc" else None
    out = IlrePostprocessor(target=target, ratio=0.25).postprocess_nodes(retrieved, query_str=QUESTION)
    assert [n.node.node_id for n in out] == ["n0", "n1", "n2", "n3"]
    assert [n.node.metadata["page"] for n in out] == [0, 1, 2, 3]
    assert ANSWER in out[2].node.get_content()
    assert all(n.node.metadata["ilre"]["compressed_tokens"] < n.node.metadata["ilre"]["original_tokens"] for n in out)
    assert nodes[2].text != out[2].node.get_content()  # the index's own nodes are left untouched
    with pytest.raises(ValueError, match="query_bundle"):
        IlrePostprocessor(target=target).postprocess_nodes(retrieved)


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_adapters_keep_whole_lines_with_granularity_unit(local_service, transport):
    target = (f"127.0.0.1:{local_service.grpc_port}" if transport == "grpc"
              else f"http://127.0.0.1:{local_service.http_port}")
    texts = [lines_context(40), lines_context(30)]
    question = "What is the value of item 17?"
    documents = [Document(page_content=t, id=f"d{i}") for i, t in enumerate(texts)]
    out = IlreCompressor(target=target, budget=120, granularity="unit").compress_documents(documents, question)
    nodes = [NodeWithScore(node=TextNode(text=t, id_=f"n{i}"), score=1.0) for i, t in enumerate(texts)]
    postprocessor = IlrePostprocessor(target=target, budget=120, granularity="unit")
    processed = postprocessor.postprocess_nodes(nodes, query_str=question)
    for text, document, node in zip(texts, out, processed):
        for info in (document.metadata["ilre"], node.node.metadata["ilre"]):
            assert info["granularity"] == "unit"
            assert_whole_lines(text, info["kept_spans"])
        assert document.metadata["ilre"]["kept_spans"] == node.node.metadata["ilre"]["kept_spans"]
    plain = IlreCompressor(target=target, budget=120, granularity="token").compress_documents(documents, question)
    assert plain[0].metadata["ilre"]["granularity"] == "token" and "kept_spans" not in plain[0].metadata["ilre"]
    default = IlreCompressor(target=target, budget=120).compress_documents(documents, question)  # the service's: units
    assert [d.metadata["ilre"] for d in default] == [d.metadata["ilre"] for d in out]
    with pytest.raises(ValueError, match=r"^granularity: must be one of token, unit \(got 'sentence'\)"):
        IlreCompressor(target=target, granularity="sentence").compress_documents(documents, question)
    with pytest.raises(ValueError, match=r"^granularity: must be one of token, unit \(got 'sentence'\)"):
        IlrePostprocessor(target=target, granularity="sentence").postprocess_nodes(nodes, query_str=question)
