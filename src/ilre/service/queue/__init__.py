"""Queues between the front ends and the engine: the in-process batcher (local.py) and the Redis
Stream (redis_stream.py, front-end side; worker.py, the workers; batch.py, the batch runner both share).
The document cache's tier on Redis and the document secret are in service/documents/."""
