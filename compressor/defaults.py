"""The algorithm's defaults, importable without torch: the prefill's S, W and chunk, the units' caps, the
strategy a request gets when it names none. A request's limits and the engine's own settings are in
engine/defaults.py.
"""

DEFAULT_STRATEGY = "cascade"  # what a request that names none gets (plain ILRe where the profile names no coarse layer)

SINK, WINDOW, CHUNK = 4, 512, 1024  # the streaming prefill's S, W and chunk length, in tokens (ILRe section 3.3)

UNIT_TOKENS = 48  # the longest unit (compressor/units.py): longer sentences, lines and records are cut finer
RECORD_TOKENS = 192  # the longest bracket group kept whole ({...} across lines: a pretty-printed JSON record)
HEADER_TOKENS = 96  # the longest table header a kept row brings along (compressor/table_headers.py)
