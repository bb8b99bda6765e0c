"""The engine: a loaded model that turns compression requests into results, below every service layer.

    messages.py      the request and result messages, validated once (field names and limits)
    engine.py        Engine: tokenize, select through the compressor, detokenize, explain
    documents.py     the document cache (IDs and encoded contexts reused by later queries), and its
                     shared tier's interface
    document_names.py  document ids keyed by a secret and the caller's scope, and the cache slots
                     behind them (another key's id finds nothing)
    document_ids.py  the shape of a document id (importable without torch)
    explain.py       the explanation page of one result
    info.py          what a running engine serves (GetModelInfo, /v1/model)
"""
