"""Every default and limit of a compression, in one place, importable without torch (a thin client,
the CLI's parser and the service's configuration read them here).

Prefill: S sink tokens, a W-token window below l_R, chunks of `CHUNK` tokens (ILRe section 3.3).
A request: the strategy and the budget it gets when it names none; how much one request may carry.
The engine: the in-process document cache and the batched prefill on accelerators.
"""

DEFAULT_STRATEGY = "cascade"  # what a request that names none gets (plain ILRe where the profile names no coarse layer)

SINK, WINDOW, CHUNK = 4, 512, 1024  # the streaming prefill's S, W and chunk length, in tokens

UNIT_TOKENS = 48  # the longest unit (compressor/units.py): longer sentences, lines and records are cut finer
RECORD_TOKENS = 192  # the longest bracket group kept whole ({...} across lines: a pretty-printed JSON record)

DEFAULT_BUDGET = 1024  # context tokens kept (sink included) when a request gives neither budget nor ratio
MAX_CONTEXT_TOKENS = 1 << 20  # context tokens one request may carry (text after tokenization, or IDs)
MAX_QUERY_TOKENS = 4096  # tokens of one query
MAX_QUERIES = 64  # queries in one request
QUERY_TOKENS = 64  # a prompt with no separate question: its last N tokens are the query (ILRe's LongBench rule)
MAX_EXPLAIN_TOKENS = 1 << 16  # context tokens an explanation page shows (larger pages no browser renders comfortably)

DOC_CACHE_MB = 1024  # the in-process document cache (IDs and encoded contexts); 0 = off
AUTO_BATCH_TOKENS = 16384  # padded context tokens per batched prefill on GPUs and NPUs (32 requests of ~500)
