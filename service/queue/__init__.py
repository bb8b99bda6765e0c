"""Queues between the front ends and the engine: the in-process batcher (local.py) and the Redis
Stream (redis_stream.py, front-end side; worker.py, the workers)."""
