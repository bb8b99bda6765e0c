"""The engine: a loaded model that turns compression requests into results, below every service layer. The
messages it takes and gives are the contract's (contract/: requests, results, info, document ids, defaults).

    engine.py        Engine: a request through its stages (prepare, encode, answer, finish); `compress` is the
                     library's call, `run` the service's
    engine_config.py EngineConfig: what an Engine is built from (model, placement, prefill, limits)
    encodings.py     the encoding policy: which encoded context a request reads, what the document cache keeps,
                     what a fallback reads, which documents are offered for deepening (one object to the pipeline)
    engine_settings.py  the settings every model-loading command shares (the CLI's flags, README's table)
    prepared.py      the Prepared stage and the checks of a request's token IDs
    results.py       Selections -> CompressResults (ids, text, spans, timings, the explanation page)
    documents.py     the document cache (IDs and encoded contexts reused by later queries), and its
                     shared tier's interface
    document_names.py  document ids keyed by a secret and the caller's scope, and the cache slots
                     behind them (another key's id finds nothing)
    deepening.py     documents encoded in full to l_R while the engine is idle, for their later queries
    explain.py       the explanation page of one result

A request's stages, named once:
    CompressRequest  (contract/messages.py) as it arrived, its fields validated
    Prepared         (prepared.py) checked and tokenized: its document named and held, its strategy resolved
                     for the layer, the model's profile and the context's length, the budget and DCA decided
    SelectionJob     (compressor/pipeline.py) one query's ids, budget, strategy and units
    Selection        (compressor/pipeline.py) the kept indices, the timings, the scores
    CompressResults  (contract/messages.py) one CompressResult (the contract's fields) per query, always a list inside;
                     the single-result shape of a one-query request only at the edges (`CompressResults.wire`:
                     `Engine.compress`, HTTP, gRPC, the CLI, the thin client)
"""
