"""The service around the compressor, in layers (each imports only from the ones after it):

    cli/        the `ilre` command line (parser, batch files, demo)
    server.py   composition of a front end: queue + gRPC + HTTP (+ sidecar), graceful shutdown
    client.py   the Python gRPC client
    transport/  where requests enter: front end, gRPC, HTTP JSON, the engine sidecar
    queue/      in-process batcher, Redis Stream queue and its workers
    config.py   ServiceConfig from flags and ILRE_* variables;  metrics.py  Prometheus
    api/        messages, errors, the Engine, model info, API keys
"""
