"""ilre: prompt compression by the query's attention at a retrieval layer l_R (README.md).

Floors, each importing only those below it: kernels -> models -> compressor -> engine -> service and
evaluation (-> training: calibration and Locret's head) -> cli and integrations (tests/test_layers.py); v1 holds
the gRPC API (compressor.proto) and its generated stubs. Every command's settings are declared once
(contract/settings.py).
"""
