"""The document cache's service side: its tier on Redis that every worker reads (redis_tier.py), and the
secret the workers' document ids are keyed with, agreed on Redis (secret.py). The cache itself and its
in-process tier are the engine's (engine/documents.py)."""
