"""Where requests enter: the transport-independent front end (frontend.py) and the adapters onto it:
gRPC (grpc_server.py, auth.py, convert.py), HTTP JSON and the gateway routes (http_app.py, gateway.py).
The engine sidecar, which also enters through the front end, is a product of its own (service/sidecar/)."""
