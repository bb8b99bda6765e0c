"""Wire messages (ilre.v1 protobuf) <-> the JSON-shaped dicts and dataclasses of messages.py.

Requests become the same dict a batch line or the HTTP mirror carries, so every transport goes
through `CompressRequest.from_json` and reports bad input identically.
"""

from __future__ import annotations

from typing import Any, Iterator

from google.protobuf import json_format, struct_pb2

from ...contract.messages import CompressResult, CompressResults, InputError

try:
    from ...v1 import compressor_pb2 as pb
    from ...v1 import compressor_pb2_grpc as pb_grpc
except ImportError as exc:  # the stubs are generated, not committed
    raise ImportError("gRPC stubs missing: run `make proto` (part of `make setup`)") from exc

__all__ = ["pb", "pb_grpc", "request_to_dict", "dict_to_request", "result_to_proto", "result_from_proto",
           "results_to_proto", "results_from_proto", "StreamAssembler", "stream_parts"]


def request_to_dict(msg: "pb.CompressRequest") -> dict[str, Any]:
    """The fields the message sets, named as in the JSON contract."""
    data: dict[str, Any] = {}
    if msg.id:
        data["id"] = msg.id
    for name in ("context", "query"):
        which = msg.WhichOneof(f"{name}_input")
        if which in (name, "document_id"):
            data[which] = getattr(msg, which)
        elif which is not None:
            data[which] = list(getattr(msg, which).ids)
    if msg.queries:
        data["queries"] = list(msg.queries)
    if msg.queries_ids:
        data["queries_ids"] = [list(q.ids) for q in msg.queries_ids]
    if msg.document_ids:
        data["document_ids"] = list(msg.document_ids)
    if msg.budgets:
        data["budgets"] = list(msg.budgets)
    size = msg.WhichOneof("size")
    if size is not None:
        data[size] = getattr(msg, size)
    if msg.strategy:
        data["strategy"] = msg.strategy
    if msg.HasField("strategy_options"):
        data["strategy_options"] = _integral(json_format.MessageToDict(msg.strategy_options))
    if msg.dca:
        data["dca"] = msg.dca
    if msg.HasField("layer"):
        data["layer"] = msg.layer
    if msg.layer_choice:
        if "layer" in data:
            raise InputError("layer_choice", "give layer or layer_choice, not both")
        data["layer"] = msg.layer_choice
    if msg.explain:
        data["explain"] = True
    if msg.granularity:
        data["granularity"] = msg.granularity
    return data


def dict_to_request(data: dict[str, Any]) -> "pb.CompressRequest":
    """A request message from contract fields (the client side); TypeError/ValueError on bad types."""
    msg = pb.CompressRequest()
    unknown = set(data) - {"id", "context", "context_ids", "query", "query_ids", "budget", "ratio",
                           "strategy", "strategy_options", "dca", "layer", "document_id", "queries", "queries_ids",
                           "explain", "granularity", "document_ids", "budgets"}
    if unknown:
        raise InputError(sorted(unknown)[0], "unknown field")
    for name, value in data.items():
        if value is None:
            continue
        if name in ("context_ids", "query_ids"):
            getattr(msg, name).SetInParent()  # an empty list is still "given"
            getattr(msg, name).ids.extend(value)
        elif name in ("queries", "document_ids", "budgets"):
            getattr(msg, name).extend(value)
        elif name == "queries_ids":
            msg.queries_ids.extend(pb.TokenIds(ids=ids) for ids in value)
        elif name == "strategy_options":
            struct = struct_pb2.Struct()
            struct.update(value)
            msg.strategy_options.CopyFrom(struct)
        elif name == "id":
            msg.id = str(value)
        elif name == "layer" and isinstance(value, str):
            msg.layer_choice = value
        else:
            setattr(msg, name, value)
    return msg


def result_to_proto(result: CompressResult) -> "pb.CompressResponse":
    return pb.CompressResponse(
        id="" if result.id is None else str(result.id), token_ids=result.token_ids,
        kept_indices=result.kept_indices, compressed_context=result.compressed_context, query=result.query,
        original_tokens=result.original_tokens, compressed_tokens=result.compressed_tokens,
        ratio=result.ratio, model=result.model, layer=result.layer, strategy=result.strategy,
        dca=result.dca, passthrough=result.passthrough, timings_ms=result.timings_ms,
        document_id=result.document_id or "", explanation=result.explanation or "", budget=result.budget or 0,
        granularity=result.granularity, kept_spans=[pb.Span(start=s, end=e) for s, e in result.kept_spans or ()],
        fell_back=result.fell_back, resumed_tokens=result.resumed_tokens,
    )


def result_from_proto(msg: "pb.CompressResponse") -> CompressResult:
    return CompressResult(
        id=msg.id or None, token_ids=list(msg.token_ids), kept_indices=list(msg.kept_indices),
        compressed_context=msg.compressed_context, query=msg.query, original_tokens=msg.original_tokens,
        compressed_tokens=msg.compressed_tokens, ratio=msg.ratio, model=msg.model, layer=msg.layer,
        strategy=msg.strategy, dca=msg.dca, passthrough=msg.passthrough, timings_ms=dict(msg.timings_ms),
        document_id=msg.document_id or None, explanation=msg.explanation or None, budget=msg.budget or None,
        granularity=msg.granularity or "token", kept_spans=[[s.start, s.end] for s in msg.kept_spans] or None,
        fell_back=msg.fell_back, resumed_tokens=msg.resumed_tokens,
    )


def results_to_proto(results: CompressResults) -> "pb.CompressQueriesResponse":
    return pb.CompressQueriesResponse(id="" if results.id is None else str(results.id), document_id=results.document_id,
                                      results=[result_to_proto(r) for r in results.results])


def results_from_proto(msg: "pb.CompressQueriesResponse") -> CompressResults:
    return CompressResults(msg.id or None, msg.document_id, [result_from_proto(r) for r in msg.results])


class StreamAssembler:
    """Collects CompressStream messages: the request first, then context pieces, within limits."""

    def __init__(self, max_context_bytes: int, max_context_tokens: int):
        self.max_bytes = max_context_bytes
        self.max_tokens = max_context_tokens
        self.data: dict[str, Any] | None = None
        self._text: list[str] = []
        self._ids: list[int] = []
        self._bytes = 0

    def add(self, part: "pb.CompressStreamRequest") -> None:
        which = part.WhichOneof("part")
        if self.data is None:
            if which != "request":
                raise InputError("request", "the first CompressStream message must carry the request")
            self.data = request_to_dict(part.request)
            if "context" in self.data:
                self._add_text(self.data.pop("context"))
            if "context_ids" in self.data:
                self._add_ids(self.data.pop("context_ids"))
            return
        if which == "request":
            raise InputError("request", "only the first CompressStream message may carry the request")
        if which == "context_text":
            self._add_text(part.context_text)
        elif which == "context_ids":
            self._add_ids(part.context_ids.ids)
        else:
            raise InputError("part", "a CompressStream message after the first must carry context_text or context_ids")

    def _add_text(self, text: str) -> None:
        if self._ids:
            raise InputError("context", "give either context or context_ids, not both")
        self._bytes += len(text.encode("utf-8"))
        if self._bytes > self.max_bytes:
            raise InputError("context", f"streamed context exceeds the limit of {self.max_bytes} bytes (max_context_bytes)")
        self._text.append(text)

    def _add_ids(self, ids) -> None:
        if self._text:
            raise InputError("context_ids", "give either context or context_ids, not both")
        self._ids.extend(ids)
        if len(self._ids) > self.max_tokens:
            raise InputError("context_ids", f"more than {self.max_tokens} tokens exceed the limit (max_context_tokens)")

    def finish(self) -> dict[str, Any]:
        """The assembled request dict (InputError if the stream carried no request)."""
        if self.data is None:
            raise InputError("request", "CompressStream received no messages")
        data = dict(self.data)
        if self._text:
            data["context"] = "".join(self._text)
        elif self._ids:
            data["context_ids"] = list(self._ids)
        return data


def stream_parts(data: dict[str, Any], piece: int) -> Iterator["pb.CompressStreamRequest"]:
    """Split a request dict into CompressStream messages: options first, then `piece`-sized context
    pieces (characters of text, or token IDs); the client side of StreamAssembler."""
    head = {k: v for k, v in data.items() if k not in ("context", "context_ids")}
    yield pb.CompressStreamRequest(request=dict_to_request(head))
    text, ids = data.get("context"), data.get("context_ids")
    if text is not None:
        for start in range(0, max(len(text), 1), piece):
            yield pb.CompressStreamRequest(context_text=text[start:start + piece])
    elif ids is not None:
        for start in range(0, max(len(ids), 1), piece):
            yield pb.CompressStreamRequest(context_ids=pb.TokenIds(ids=ids[start:start + piece]))


def _integral(value: Any) -> Any:
    """Struct numbers are doubles: turn the integral ones back into ints (kernel sizes etc.)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_integral(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    return value

