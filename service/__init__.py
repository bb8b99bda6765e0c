"""Transports around the compressor: the engine, the CLI (and later gRPC, HTTP, queue, workers)."""
