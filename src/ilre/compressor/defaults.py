"""The algorithm's defaults, importable without torch: the prefill's S, W and chunk, the units' caps, the
strategy a request gets when it names none. A request's limits and the engine's own settings are in
contract/defaults.py.
"""

# The cascade's fallbacks, as `ilre calibrate` writes them into a profile (compressor/strategies/cascade.py), 0 =
# never unless a request sets them. coarse_below: the whole context is read to l_R at once when the coarse layer's
# own peak strength is below it, decided before the candidate pass, so such a query costs what plain ILRe at l_R
# costs; deepen_below: the same after the candidate pass, when l_R's peak over the candidates is below it, which
# costs the candidate pass more than plain ILRe at l_R. Neither peak separates a paraphrased question (where depth
# helps) from records and logs (where it does not): bench/mixed_bench.py, README's How it works.
COARSE_BELOW = 0.0
DEEPEN_BELOW = 0.0

SINK, WINDOW, CHUNK = 4, 512, 1024  # the streaming prefill's S, W and chunk length, in tokens (ILRe section 3.3)

UNIT_TOKENS = 48  # the longest unit (compressor/units.py): longer sentences, lines and records are cut finer
RECORD_TOKENS = 192  # the longest bracket group kept whole ({...} across lines: a pretty-printed JSON record)
HEADER_TOKENS = 96  # the longest table header a kept row brings along (compressor/table_headers.py)
