"""The service around the engine, in layers (each imports only from the ones after it, and from
`ilre.engine`):

    server.py   composition of a front end: queue + gRPC + HTTP (+ sidecar), graceful shutdown
    client.py   the Python gRPC client (thin: no torch)
    transport/  where requests enter: front end, gRPC, HTTP JSON, the engine sidecar
    queue/      in-process batcher, Redis Stream queue and its workers, the batch runner they share
    config.py   ServiceConfig from flags and ILRE_* variables;  metrics.py  Prometheus
    errors.py   service failures and their gRPC/HTTP statuses;  keys.py, quotas.py  API keys (and the
                document scope each reads) and limits
"""
