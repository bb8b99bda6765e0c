"""gRPC authentication: an interceptor that checks `authorization: Bearer <key>` against ApiKeys."""

from __future__ import annotations

import grpc

from ..common.keys import UNAUTHENTICATED_MESSAGE, ApiKeys

# Probes and schema discovery answer without a key; the Compressor service needs one.
OPEN_METHODS = ("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/",
                "/grpc.reflection.v1.ServerReflection/")


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Rejects calls without an accepted key with UNAUTHENTICATED (health and reflection exempt)."""

    def __init__(self, keys: ApiKeys):
        self.keys = keys

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_METHODS):
            return handler
        metadata = dict(handler_call_details.invocation_metadata or ())
        if self.keys.check(metadata.get("authorization")):
            return handler
        return _denying(handler)


async def _deny(request_or_iterator, context: grpc.aio.ServicerContext):
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)


def _denying(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that only aborts."""
    codecs = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(_deny, **codecs)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(_deny, **codecs)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(_deny, **codecs)
    return grpc.stream_stream_rpc_method_handler(_deny, **codecs)
