"""The service around the engine, in floors (each imports only from the floors below it, and from
`ilre.engine`; tests/test_layers.py checks it):

    server.py    the top floor: a process composed of the engine, a queue, the transports (+ the sidecar),
                 graceful shutdown
    worker.py    beside it: `ilre worker`, the engine composed with the Redis queue and the document tier
    transport/   where requests enter: the front end, gRPC, HTTP JSON and the gateway routes
    sidecar/     the engine sidecar (SGLang's, vLLM's and llama.cpp's own APIs), beside the transports
    queue/       the in-process batcher, the Redis Stream queue, the batch runner the batcher and workers share
    documents/   the document cache's Redis tier and the document secret
    common/      the ground floor: config.py (ServiceConfig from flags and ILRE_* variables), errors.py
                 (failures and their gRPC/HTTP statuses), keys.py, quotas.py (API keys, the document scope
                 each reads, limits), metrics.py, tracing.py, request_log.py, redis_url.py, redis_connection.py
    client.py    the Python gRPC client (thin: no torch), apart from the floors
"""
