"""Queues between the front ends and the engine: the in-process batcher (local.py) and the Redis
Stream (redis_stream.py, front-end side; scripts.py, its atomic steps; batch.py, the batch runner the batcher and
the workers share). The workers that read the stream are beside the server (service/worker.py): they compose a
queue with the engine and the document cache's Redis tier (service/documents/)."""
