"""A request's defaults and limits and the engine's own settings, importable without torch (a thin client,
the CLI's parser and the service's configuration read them here). The algorithm's are in
compressor/defaults.py.
"""

DEFAULT_STRATEGY = "cascade"  # what a request that names none gets (plain ILRe where the profile names no coarse layer)
DEFAULT_BUDGET = 1024  # context tokens kept (sink included) when a request gives neither budget nor ratio
MAX_CONTEXT_TOKENS = 1 << 20  # context tokens one request may carry (text after tokenization, or IDs)
MAX_QUERY_TOKENS = 4096  # tokens of one query
MAX_QUERIES = 64  # queries in one request
MAX_DOCUMENTS = 1024  # documents one question is asked of in one request (a conversation's messages)
QUERY_TOKENS = 64  # a prompt with no separate question: its last N tokens are the query (ILRe's LongBench rule)
MAX_EXPLAIN_TOKENS = 1 << 16  # context tokens an explanation page shows (larger pages no browser renders comfortably)

DOC_CACHE_MB = 1024  # the in-process document cache (IDs and encoded contexts); 0 = off
DOC_CACHE_SHARE = 0.125  # of each cache tier's cap, held for each caller's scope against the others' traffic
AUTO_BATCH_TOKENS = 16384  # padded context tokens per batched prefill on GPUs and NPUs (32 requests of ~500)
