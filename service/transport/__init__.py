"""Where requests enter: the transport-independent front end (frontend.py) and the adapters onto it:
gRPC (grpc_server.py, auth.py, convert.py), HTTP JSON (http_app.py) and the engine sidecar (sidecar/)."""
