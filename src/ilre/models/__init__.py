"""Loading a causal LM truncated to its first l_R layers; per-model profiles; the embedded default."""
