"""API keys (UNAUTHENTICATED without the right one), TLS and mutual TLS with certificates made
in the test (trustme), over real gRPC and HTTPS on loopback."""

from __future__ import annotations

import logging
import ssl

import grpc
import httpx
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from ilre.service.client import Client, ClientError
from ilre.service.server import ServiceThread

from .conftest import QUERY, context, service_config

KEY, OTHER_KEY = "k-7f3a9c2e-first", "k-0b1d4e8f-second"


@pytest.fixture(scope="module")
def keyed(engine, tmp_path_factory):
    keys_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys_file.write_text(f"# accepted keys\n{OTHER_KEY}\n")
    config = service_config({"ILRE_API_KEYS": KEY}, api_keys_file=str(keys_file))
    assert KEY not in repr(config) and len(config.api_keys) == 2
    with ServiceThread(config, engine) as svc:
        yield svc


@pytest.mark.parametrize("key", [None, "wrong", KEY + "x", KEY[:-1], ""])
def test_missing_or_wrong_key_is_unauthenticated(keyed, key, caplog):
    caplog.set_level(logging.DEBUG)
    with Client(f"127.0.0.1:{keyed.grpc_port}", api_key=key) as client:
        for call in (lambda: client.compress(context(0), QUERY, budget=16), client.model_info,
                     lambda: client.compress_stream(context(0), QUERY, budget=16)):
            with pytest.raises(ClientError) as err:
                call()
            assert err.value.code == "UNAUTHENTICATED" and "authorization" in err.value.message
    headers = {"authorization": f"Bearer {key}".strip()} if key is not None else {}
    reply = httpx.post(f"http://127.0.0.1:{keyed.http_port}/v1/compress", headers=headers,
                       json={"context": context(0), "query": QUERY, "budget": 16})
    assert reply.status_code == 401 and reply.json()["code"] == "UNAUTHENTICATED"
    assert httpx.get(f"http://127.0.0.1:{keyed.http_port}/v1/model", headers=headers).status_code == 401
    assert KEY not in caplog.text and OTHER_KEY not in caplog.text


@pytest.mark.parametrize("key", [KEY, OTHER_KEY])
def test_right_key_is_accepted(keyed, key):
    with Client(f"127.0.0.1:{keyed.grpc_port}", api_key=key, timeout=120) as client:
        assert client.compress(context(0), QUERY, budget=16).compressed_tokens == 16
        assert client.model_info().queue == "local"
    reply = httpx.post(f"http://127.0.0.1:{keyed.http_port}/v1/compress", headers={"authorization": f"bearer {key}"},
                       json={"context": context(0), "query": QUERY, "budget": 16}, timeout=120)
    assert reply.status_code == 200 and reply.json()["compressed_tokens"] == 16


def test_probes_and_reflection_need_no_key(keyed):
    with grpc.insecure_channel(f"127.0.0.1:{keyed.grpc_port}") as channel:
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        assert "ilre.v1.Compressor" in ProtoReflectionDescriptorDatabase(channel).get_services()
    for path in ("/healthz", "/readyz", "/metrics"):
        assert httpx.get(f"http://127.0.0.1:{keyed.http_port}{path}").status_code == 200


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, as PEM files."""
    ca = trustme.CA()
    server, client = ca.issue_cert("127.0.0.1", "localhost"), ca.issue_cert("client@ilre.test")
    d = tmp_path_factory.mktemp("pki")
    files = {"ca": d / "ca.pem", "cert": d / "server.pem", "key": d / "server.key",
             "client_cert": d / "client.pem", "client_key": d / "client.key"}
    ca.cert_pem.write_to_path(files["ca"])
    server.private_key_pem.write_to_path(files["key"])
    server.cert_chain_pems[0].write_to_path(files["cert"])
    client.private_key_pem.write_to_path(files["client_key"])
    client.cert_chain_pems[0].write_to_path(files["client_cert"])
    other = trustme.CA().issue_cert("intruder@ilre.test")  # signed by a CA the server does not trust
    other.private_key_pem.write_to_path(d / "other.key")
    other.cert_chain_pems[0].write_to_path(d / "other.pem")
    return {k: str(v) for k, v in files.items()} | {"other_cert": str(d / "other.pem"), "other_key": str(d / "other.key")}


def test_tls(engine, pki):
    with ServiceThread(service_config(tls_cert=pki["cert"], tls_key=pki["key"]), engine) as svc:
        target = f"127.0.0.1:{svc.grpc_port}"
        with Client(target, tls_ca=pki["ca"], timeout=120) as client:
            assert client.compress(context(1), QUERY, budget=20).compressed_tokens == 20
        with Client(target, timeout=10) as plain, pytest.raises(ClientError) as err:
            plain.model_info()  # plaintext against a TLS port
        assert err.value.code == "UNAVAILABLE"
        with Client(target, tls_ca=trustme.CA().cert_pem.bytes(), timeout=10) as wrong_ca, pytest.raises(ClientError):
            wrong_ca.model_info()
        reply = httpx.get(f"https://127.0.0.1:{svc.http_port}/readyz", verify=ssl.create_default_context(cafile=pki["ca"]))
        assert reply.status_code == 200 and reply.json()["ready"] is True
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"https://127.0.0.1:{svc.http_port}/readyz")  # not trusted without the CA


def test_mutual_tls(engine, pki):
    config = service_config(tls_cert=pki["cert"], tls_key=pki["key"], tls_client_ca=pki["ca"])
    with ServiceThread(config, engine) as svc:
        target = f"127.0.0.1:{svc.grpc_port}"
        with Client(target, tls_ca=pki["ca"], tls_cert=pki["client_cert"], tls_key=pki["client_key"], timeout=120) as c:
            assert c.compress(context(2), QUERY, budget=20).compressed_tokens == 20
        for extra in ({}, {"tls_cert": pki["other_cert"], "tls_key": pki["other_key"]}):
            with Client(target, tls_ca=pki["ca"], timeout=10, **extra) as c, pytest.raises(ClientError) as err:
                c.model_info()
            assert err.value.code == "UNAVAILABLE"
        ctx = ssl.create_default_context(cafile=pki["ca"])
        ctx.load_cert_chain(pki["client_cert"], pki["client_key"])
        assert httpx.get(f"https://127.0.0.1:{svc.http_port}/healthz", verify=ctx).status_code == 200
        with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
            httpx.get(f"https://127.0.0.1:{svc.http_port}/healthz", verify=ssl.create_default_context(cafile=pki["ca"]))
