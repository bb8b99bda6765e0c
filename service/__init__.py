"""Transports around the compressor: the engine, the CLI, and the service (gRPC + HTTP front ends,
the in-process and Redis queues, workers, the Python client)."""
