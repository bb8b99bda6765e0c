"""Retrieval-framework adapters: LangChain's document compressor and LlamaIndex's node postprocessor,
both compressing each retrieved document for the query through ilre (a running service or in process)."""
