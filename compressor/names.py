"""Names the compressor is addressed by, importable without torch (a thin client reads them)."""

DEFAULT_STRATEGY = "cascade"  # what a request that names none gets (plain ILRe where the profile names no coarse layer)
