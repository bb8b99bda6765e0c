"""Python client for the ilre gRPC service: `Client` (blocking) and `AsyncClient` (asyncio).

    with Client("127.0.0.1:50051") as client:
        result = client.compress(context=long_text, query="Question: ...? Answer:", budget=1024)
        result.token_ids, result.compressed_context
        whole = client.compress(context=long_text, query="...", budget=1024, granularity="unit")
        [long_text[start:end] for start, end in whole.kept_spans]   # the kept sentences, lines, records
        again = client.compress(document_id=result.document_id, query="Question: ...", budget=1024)
        many = client.compress_queries(long_text, ["Question: a?", "Question: b?"], budget=1024)

Results are `messages.CompressResult` (the JSON contract), CompressResults for several queries
(document_id + one result per query); failures raise `ClientError` with the
gRPC status name, the server's message ("budget: must be a positive integer (got 0)") and the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from ..contract.info import ModelInfo
from ..contract.messages import CompressResult, CompressResults
from .transport.convert import dict_to_request, pb, pb_grpc, result_from_proto, results_from_proto, stream_parts

DEFAULT_TIMEOUT_S = 300.0
STREAM_PIECE = 1 << 20  # characters (or token IDs) per CompressStream message

Pem = str | Path | bytes  # a PEM file's path, or its contents


class ClientError(Exception):
    """A call that failed: code is the gRPC status name (INVALID_ARGUMENT, UNAVAILABLE, ...)."""

    def __init__(self, code: str, message: str, field: str | None = None, retry_after_s: float | None = None):
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.field = code, message, field
        self.retry_after_s = retry_after_s  # set when an API key's limit refused the call

    @classmethod
    def from_rpc(cls, exc: grpc.RpcError) -> "ClientError":
        trailers = dict(exc.trailing_metadata() or ()) if hasattr(exc, "trailing_metadata") else {}
        retry = trailers.get("retry-after")
        return cls(exc.code().name, exc.details() or "", trailers.get("ilre-field"),
                   float(retry) if retry else None)


@dataclass(frozen=True)
class Connection:
    """Where and how to connect. TLS is on when tls_ca is given (the CA that signed the server's
    certificate); tls_cert + tls_key add a client certificate (mutual TLS)."""

    target: str
    api_key: str | None = None
    tls_ca: Pem | None = None
    tls_cert: Pem | None = None
    tls_key: Pem | None = None
    tls_server_name: str | None = None  # when the certificate's name differs from the target host
    max_message_bytes: int = 16 << 20

    def options(self) -> list[tuple[str, Any]]:
        options = [("grpc.max_send_message_length", self.max_message_bytes),
                   ("grpc.max_receive_message_length", self.max_message_bytes)]
        if self.tls_server_name:
            options.append(("grpc.ssl_target_name_override", self.tls_server_name))
        return options

    def credentials(self) -> grpc.ChannelCredentials | None:
        if self.tls_ca is None and self.tls_cert is None:
            return None
        return grpc.ssl_channel_credentials(root_certificates=_pem(self.tls_ca), private_key=_pem(self.tls_key),
                                            certificate_chain=_pem(self.tls_cert))

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.api_key}"),) if self.api_key else ()


def _pem(value: Pem | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return Path(value).read_bytes()


def _fields(context: str | list[int] | None, query: str | list[int] | None, extra: dict[str, Any],
            queries: list[str] | list[list[int]] | None = None) -> dict[str, Any]:
    """Contract fields: a list for context/query means token IDs, and so do lists in `queries`."""
    data = dict(extra)
    for name, value in (("context", context), ("query", query)):
        if isinstance(value, list):
            data[f"{name}_ids"] = value
        elif value is not None:
            data[name] = value
    if queries is not None:
        data["queries_ids" if queries and isinstance(queries[0], list) else "queries"] = queries
    return data


class Client:
    """Blocking client; one channel, safe to share between threads."""

    def __init__(self, target: str, *, timeout: float = DEFAULT_TIMEOUT_S, **connection: Any):
        self.connection = conn = Connection(target, **connection)
        self.timeout = timeout
        creds = conn.credentials()
        self._channel = (grpc.secure_channel(target, creds, conn.options()) if creds
                         else grpc.insecure_channel(target, conn.options()))
        self._stub = pb_grpc.CompressorStub(self._channel)

    def compress(self, context: str | list[int] | None = None, query: str | list[int] | None = None, *,
                 timeout: float | None = None, **fields: Any) -> CompressResult:
        """One request; fields: id, document_id (instead of context), budget | ratio, strategy,
        strategy_options, dca, layer, granularity ("token" | "unit": the result's kept_spans then name
        the kept sentences, lines or records)."""
        request = dict_to_request(_fields(context, query, fields))
        return self._call(self._stub.Compress, request, timeout)

    def compress_queries(self, context: str | list[int] | None = None, queries: list[str] | list[list[int]] | None = None,
                         *, timeout: float | None = None, **fields: Any) -> CompressResults:
        """Several queries of one context (or document_id=...): one prefill, one result per query."""
        request = dict_to_request(_fields(context, None, fields, queries))
        return self._call(self._stub.CompressQueries, request, timeout, results_from_proto)

    def compress_stream(self, context: str | list[int] | None = None, query: str | list[int] | None = None, *,
                        timeout: float | None = None, piece: int = STREAM_PIECE, **fields: Any) -> CompressResult:
        """The same through CompressStream, the context sent in pieces (for very large contexts)."""
        parts = stream_parts(_fields(context, query, fields), piece)
        return self._call(self._stub.CompressStream, parts, timeout)

    def _call(self, method: Any, request: Any, timeout: float | None, convert: Any = result_from_proto) -> Any:
        try:
            reply = method(request, timeout=timeout or self.timeout, metadata=self.connection.metadata())
        except grpc.RpcError as exc:
            raise ClientError.from_rpc(exc) from None
        return convert(reply)

    def model_info(self, timeout: float | None = None) -> ModelInfo:
        try:
            reply = self._stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=timeout or self.timeout,
                                            metadata=self.connection.metadata())
        except grpc.RpcError as exc:
            raise ClientError.from_rpc(exc) from None
        return _model_info(reply)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncClient:
    """asyncio client (grpc.aio); create and use it inside one event loop."""

    def __init__(self, target: str, *, timeout: float = DEFAULT_TIMEOUT_S, **connection: Any):
        self.connection = conn = Connection(target, **connection)
        self.timeout = timeout
        creds = conn.credentials()
        self._channel = (grpc.aio.secure_channel(target, creds, conn.options()) if creds
                         else grpc.aio.insecure_channel(target, conn.options()))
        self._stub = pb_grpc.CompressorStub(self._channel)

    async def compress(self, context: str | list[int] | None = None, query: str | list[int] | None = None, *,
                       timeout: float | None = None, **fields: Any) -> CompressResult:
        request = dict_to_request(_fields(context, query, fields))
        return await self._call(self._stub.Compress, request, timeout)

    async def compress_queries(self, context: str | list[int] | None = None,
                               queries: list[str] | list[list[int]] | None = None, *, timeout: float | None = None,
                               **fields: Any) -> CompressResults:
        request = dict_to_request(_fields(context, None, fields, queries))
        return await self._call(self._stub.CompressQueries, request, timeout, results_from_proto)

    async def compress_stream(self, context: str | list[int] | None = None, query: str | list[int] | None = None,
                              *, timeout: float | None = None, piece: int = STREAM_PIECE,
                              **fields: Any) -> CompressResult:
        parts = stream_parts(_fields(context, query, fields), piece)
        return await self._call(self._stub.CompressStream, parts, timeout)

    async def _call(self, method: Any, request: Any, timeout: float | None, convert: Any = result_from_proto) -> Any:
        try:
            reply = await method(request, timeout=timeout or self.timeout, metadata=self.connection.metadata())
        except grpc.RpcError as exc:
            raise ClientError.from_rpc(exc) from None
        return convert(reply)

    async def model_info(self, timeout: float | None = None) -> ModelInfo:
        try:
            reply = await self._stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=timeout or self.timeout,
                                                  metadata=self.connection.metadata())
        except grpc.RpcError as exc:
            raise ClientError.from_rpc(exc) from None
        return _model_info(reply)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


def _model_info(reply: "pb.ModelInfo") -> ModelInfo:
    values = {name: getattr(reply, name) for name in ModelInfo.__dataclass_fields__}
    return ModelInfo(**{**values, "strategies": list(reply.strategies), "layer_choices": dict(reply.layer_choices),
                        "default_strategy_options": dict(reply.default_strategy_options)})
