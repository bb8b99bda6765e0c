"""HTTP transport (starlette): /healthz, /readyz, /metrics, GET /v1/model, POST /v1/compress and
POST /v1/explain (the same request; the answer is the explanation page, text/html).

POST /v1/compress takes a batch line's fields as a JSON object and answers with the contract's
fields, exactly as gRPC Compress does; with `queries` it answers {"id", "document_id", "results"}
as CompressQueries does. A body with `messages` and no context is a gateway's (gateway.py: chat
messages in and out, LiteLLM's `headroom` contract), and GET /v1/retrieve/{hash} takes back what
one compressed. An unknown or evicted document_id is a 404. Errors are {"id", "error", "code", "field"} (the batch
line's {"id", "error"} plus the status code name and the field) with the matching HTTP status; a
refusal by an API key's limits (429) also carries `retry_after_s` and a Retry-After header.
An optional `X-Request-Timeout: <seconds>` header sets the deadline; `X-Request-Id` names the request
(else one is made) and comes back on the answer, and a W3C `traceparent` header parents its trace.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from ...contract.defaults import DEFAULT_BUDGET
from ..common.errors import Code, HTTP_STATUS, ServiceError
from ..common.keys import UNAUTHENTICATED_MESSAGE
from ..common.quotas import retry_after_header
from ..common.request_log import request_id
from .frontend import Frontend
from .gateway import Call, Gateway, is_gateway_request
from .http_common import decode_json, parse_timeout, read_body, unless_disconnected


def build_app(frontend: Frontend) -> Starlette:
    """The ASGI app over one Frontend (lifespan is owned by server.py, which starts the queue)."""
    gateway = Gateway(frontend, frontend.defaults.get("budget", DEFAULT_BUDGET))

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        ready = await frontend.ready()
        return JSONResponse({"ready": ready, "queue": frontend.queue.kind}, status_code=200 if ready else 503)

    async def metrics(request: Request) -> Response:
        return Response(await frontend.metrics_text(), media_type=frontend.metrics.content_type)

    async def model(request: Request) -> Response:
        if not frontend.config.api_keys.check(request.headers.get("authorization")):
            return _error(None, ServiceError(Code.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE))
        try:
            return JSONResponse((await frontend.model_info()).to_dict())
        except ServiceError as exc:
            return _error(None, exc)

    async def compress(request: Request) -> Response:
        return await _compress(request, "http.compress", explain=False)

    async def explain(request: Request) -> Response:
        return await _compress(request, "http.explain", explain=True)

    async def _compress(request: Request, method: str, explain: bool) -> Response:
        data: Any = None
        rid = None
        try:
            rid = request_id(request.headers.get("x-request-id"))
            caller = frontend.config.api_keys.identify(request.headers.get("authorization"))
            if caller is None:
                raise ServiceError(Code.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
            data = decode_json(await read_body(request, frontend.config.max_message_bytes))
            timeout = parse_timeout(request.headers.get("x-request-timeout"))
        except ServiceError as exc:  # refused before it reaches the front end: counted here
            frontend.metrics.requests.labels(method).inc()
            frontend.record_error(exc.code)
            return _error(data, exc, rid)
        if explain and isinstance(data, dict):
            data = {**data, "explain": True}
        if not explain and is_gateway_request(data):
            call = Call(timeout, caller, rid, dict(request.headers))
            return await _answer(request, gateway.compress(data, call), data, rid)
        work = frontend.compress(data, timeout, method, many=False if explain else None,
                                 caller=caller, rid=rid, trace_parent=dict(request.headers))
        result = await _answer(request, work, data, rid)
        if isinstance(result, Response):
            return result
        if explain:
            return HTMLResponse(result.results[0].explanation, headers={"x-request-id": rid})
        return JSONResponse(result.to_dict(), headers={"x-request-id": rid})

    async def retrieve(request: Request) -> Response:
        rid = request_id(request.headers.get("x-request-id"))
        caller = frontend.config.api_keys.identify(request.headers.get("authorization"))
        if caller is None:
            return _error(None, ServiceError(Code.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE), rid)
        try:
            timeout = parse_timeout(request.headers.get("x-request-timeout"))
        except ServiceError as exc:
            return _error(None, exc, rid)
        params = request.query_params
        work = gateway.retrieve(request.path_params["hash"], params.get("query"), params.get("budget"),
                                Call(timeout, caller, rid, dict(request.headers)))
        return await _answer(request, work, None, rid)

    routes = [Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", metrics),
              Route("/v1/model", model), Route("/v1/compress", compress, methods=["POST"]),
              Route("/v1/explain", explain, methods=["POST"]),
              Route("/v1/retrieve/{hash}", retrieve, methods=["GET"])]
    return Starlette(routes=routes)


async def _answer(request: Request, work: Awaitable[Any], data: Any, rid: str) -> Any:
    """Await `work` unless the client goes away: a gateway's dict as JSON, an error as its status, a
    Response for a client gone; else the result itself (a compress outcome, for the caller to render)."""
    try:
        result = await unless_disconnected(request, asyncio.ensure_future(work))
    except ServiceError as exc:
        return _error(data, exc, rid)
    if result is None:  # the client went away; its queued work has been dropped
        return Response(status_code=HTTP_STATUS[Code.CANCELLED])
    if isinstance(result, dict):
        return JSONResponse(result, headers={"x-request-id": rid})
    return result


def _error(data: Any, exc: ServiceError, rid: str | None = None) -> JSONResponse:
    line_id = data.get("id") if isinstance(data, dict) else None
    if isinstance(line_id, bool) or not isinstance(line_id, (str, int)):
        line_id = None  # echo only an id of the contract's types (NaN or a list would not even encode)
    body = {"id": line_id, "error": exc.message, "code": exc.code.value, "field": exc.field}
    headers = {"x-request-id": rid} if rid else {}
    if exc.retry_after_s is not None:  # a limit's refusal: Retry-After in whole seconds too
        body["retry_after_s"] = round(exc.retry_after_s, 3)
        headers["retry-after"] = retry_after_header(exc.retry_after_s)
    return JSONResponse(body, status_code=exc.http_status, headers=headers)
