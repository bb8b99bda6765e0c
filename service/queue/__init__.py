"""Queues between the front ends and the engine: the in-process batcher (local.py) and the Redis
Stream (redis_stream.py, front-end side; worker.py, the workers; shared_documents.py, the document
cache's tier on Redis; document_secret.py, the secret the workers' document ids are keyed with)."""
