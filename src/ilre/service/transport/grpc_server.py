"""gRPC transport: a thin servicer onto Frontend, plus health, reflection, API keys and TLS."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from ...contract.messages import InputError
from ..common.config import ServiceConfig
from ..common.errors import Code, ConfigError, ServiceError
from ..common.keys import ANONYMOUS
from ..common.request_log import request_id
from .auth import AuthInterceptor
from .convert import StreamAssembler, pb, pb_grpc, request_to_dict, result_to_proto, results_to_proto
from .frontend import Frontend

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Compressor"].full_name  # "ilre.v1.Compressor"
HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name


async def _abort(context: grpc.aio.ServicerContext, exc: ServiceError, rid: str | None = None) -> None:
    """End the call with the error's status; the field, when known, also goes in `ilre-field`, a
    limit's retry hint in `retry-after` (seconds, a decimal), the request id in `x-request-id`."""
    metadata = (("ilre-field", exc.field),) if exc.field else ()
    if rid:
        metadata += (("x-request-id", rid),)
    if exc.retry_after_s is not None:
        metadata += (("retry-after", f"{exc.retry_after_s:.3f}"),)
    await context.abort(grpc.StatusCode[exc.code.value], exc.message, trailing_metadata=metadata)


class CompressorServicer(pb_grpc.CompressorServicer):
    """ilre.v1.Compressor: every method maps its message onto Frontend and back."""

    def __init__(self, frontend: Frontend):
        self.frontend = frontend

    async def Compress(self, request: pb.CompressRequest, context: grpc.aio.ServicerContext) -> pb.CompressResponse:
        return result_to_proto((await self._run(request_to_dict(request), context, "grpc.Compress", False)).results[0])

    async def CompressQueries(self, request: pb.CompressRequest,
                              context: grpc.aio.ServicerContext) -> pb.CompressQueriesResponse:
        data = request_to_dict(request)
        for one, many in (("query", "queries"), ("query_ids", "queries_ids")):  # one query is a list of one
            if one in data and "document_ids" not in data and not ({"queries", "queries_ids"} & set(data)):
                data[many] = [data.pop(one)]  # (document_ids take their one question as it is)
        return results_to_proto(await self._run(data, context, "grpc.CompressQueries", True))

    async def CompressStream(self, request_iterator, context: grpc.aio.ServicerContext) -> pb.CompressResponse:
        cfg = self.frontend.config
        assembler = StreamAssembler(cfg.max_context_bytes, cfg.max_context_tokens)
        try:
            async for part in request_iterator:
                assembler.add(part)
            data = assembler.finish()
        except InputError as exc:
            self.frontend.metrics.requests.labels("grpc.CompressStream").inc()
            self.frontend.record_error(Code.INVALID_ARGUMENT)
            await _abort(context, ServiceError.from_input(exc))
        return result_to_proto((await self._run(data, context, "grpc.CompressStream", False)).results[0])

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext) -> pb.ModelInfo:
        self.frontend.metrics.requests.labels("grpc.GetModelInfo").inc()
        try:
            info = await self.frontend.model_info()
        except ServiceError as exc:
            self.frontend.record_error(exc.code)
            await _abort(context, exc)
        return pb.ModelInfo(**info.to_dict())

    async def _run(self, data: dict, context: grpc.aio.ServicerContext, method: str, many: bool):
        """Run one call; its request id (the caller's `x-request-id`, or a new one) goes back in the
        trailing metadata, and the caller's `traceparent` becomes the parent of its trace."""
        metadata = dict(context.invocation_metadata() or ())
        caller = self.frontend.config.api_keys.identify(metadata.get("authorization")) or ANONYMOUS  # checked already
        try:
            rid = request_id(metadata.get("x-request-id"))
        except ServiceError as exc:
            self.frontend.metrics.requests.labels(method).inc()
            self.frontend.record_error(exc.code)
            await _abort(context, exc)
        context.set_trailing_metadata((("x-request-id", rid),))
        try:
            return await self.frontend.compress(data, context.time_remaining(), method, many, caller=caller, rid=rid,
                                                trace_parent=metadata)
        except ServiceError as exc:
            await _abort(context, exc, rid)


def build_grpc_server(frontend: Frontend, config: ServiceConfig) -> tuple[grpc.aio.Server, HealthServicer, int]:
    """The server (not started), its health servicer, and the port it is bound to."""
    cfg = config
    options = [("grpc.max_receive_message_length", cfg.max_message_bytes),
               ("grpc.max_send_message_length", cfg.max_message_bytes),
               ("grpc.so_reuseport", 0)]
    interceptors = [AuthInterceptor(cfg.api_keys)] if cfg.api_keys.enabled else []
    server = grpc.aio.server(interceptors=interceptors, options=options)
    pb_grpc.add_CompressorServicer_to_server(CompressorServicer(frontend), server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection([SERVICE_NAME, HEALTH_SERVICE_NAME, reflection.SERVICE_NAME], server)
    address = f"{cfg.host}:{cfg.grpc_port}"
    try:
        if cfg.tls:
            port = server.add_secure_port(address, server_credentials(cfg))
        else:
            port = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise ConfigError(f"grpc_port: cannot listen on {address} ({exc})") from None
    return server, health, port


def server_credentials(cfg: ServiceConfig) -> grpc.ServerCredentials:
    """TLS from PEM files; with tls_client_ca, clients must present a certificate it signed."""
    try:
        key, cert = Path(cfg.tls_key).read_bytes(), Path(cfg.tls_cert).read_bytes()
        client_ca = Path(cfg.tls_client_ca).read_bytes() if cfg.tls_client_ca else None
    except OSError as exc:
        raise ConfigError(f"tls: cannot read {exc.filename}: {exc.strerror}") from None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=client_ca,
                                       require_client_auth=client_ca is not None)


async def track_health(frontend: Frontend, health: HealthServicer, period_s: float = 1.0) -> None:
    """Keep the standard health service in step with readiness (model loaded / Redis and a worker)."""
    last = None
    while True:
        try:
            serving = await frontend.ready()
        except Exception:  # readiness must never kill the tracker: count it as not ready
            log.exception("readiness check failed")
            serving = False
        if serving != last:
            status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
            for name in ("", SERVICE_NAME):
                await health.set(name, status)
            last = serving
        await asyncio.sleep(period_s)
