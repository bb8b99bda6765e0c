"""The engine: a loaded model that turns compression requests into results, below every service layer.

    messages.py      the request and result messages, validated once (field names and limits)
    engine.py        Engine: tokenize, select through the compressor, detokenize, explain
    documents.py     the document cache (IDs and encoded contexts reused by later queries), and its
                     shared tier's interface
    document_names.py  document ids keyed by a secret and the caller's scope, and the cache slots
                     behind them (another key's id finds nothing)
    document_ids.py  the shape of a document id (importable without torch)
    deepening.py     documents encoded in full to l_R while the engine is idle, for their later queries
    explain.py       the explanation page of one result
    info.py          what a running engine serves (GetModelInfo, /v1/model)

A request's stages, named once:
    CompressRequest  (messages.py) as it arrived, its fields validated
    Prepared         (engine.py) checked and tokenized: its document named and held, its strategy resolved
                     for the layer, the model's profile and the context's length, the budget and DCA decided
    SelectionJob     (compressor/pipeline.py) one query's ids, budget, strategy and units
    Selection        (compressor/pipeline.py) the kept indices, the timings, the scores
    CompressResult   (messages.py) the contract's fields; a request with `queries` gets CompressResults, one
                     CompressResult per query
"""
