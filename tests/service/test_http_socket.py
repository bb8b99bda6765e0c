"""The HTTP server's socket: connections it accepts have TCP_NODELAY, so an answer on a kept-alive
connection is not held back until the client's delayed ACK (~40 ms per request before)."""

from __future__ import annotations

import socket
import statistics
import time

import httpx

from ilre.service.server import _listen


def test_accepted_connections_inherit_tcp_nodelay():
    server = _listen("127.0.0.1", 0)
    try:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        accepted.close()
        client.close()
    finally:
        server.close()


def test_kept_alive_requests_answer_without_the_delayed_ack_wait(local_service):
    with httpx.Client(base_url=f"http://127.0.0.1:{local_service.http_port}") as http:
        seconds = []
        for _ in range(20):  # one connection: every request after the first rides on it
            start = time.perf_counter()
            assert http.get("/healthz").status_code == 200
            seconds.append(time.perf_counter() - start)
    assert statistics.median(seconds[1:]) < 0.02, seconds  # it was 0.040-0.044 s on every one
