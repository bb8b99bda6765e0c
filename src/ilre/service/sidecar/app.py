"""The sidecar's HTTP app: the engine's own API, with long prompts compressed on the way through.

One request on a compressible route (formats.py):
  read + decode the body (http_common) -> options: defaults < x-ilre-* headers < body "compression"
  -> a plain prompt (text or token IDs): its tokens, split into prefix | context | query (prompt.py);
     fits (context <= budget)? forward the original bytes untouched; else compress through the front
     end (in-process queue or Redis workers, as `ilre serve`) and forward token IDs when the engine's
     tokenizer is ours, else text
  -> a conversation (chat, Responses, Anthropic Messages): read as messages (contract/conversation.py),
     compressed message by message as the gateway does (transport/chat_compression.py), forwarded to
     the same route with the compressed texts in place (tool calls, images, ids and order untouched)
  -> relay the engine's answer chunk by chunk, in the API's own shape
A request forwarded as it came says why: x-ilre-reason, ilre_sidecar_passthrough_total{reason} and a
log line (logger ilre.service.sidecar.app) naming the field where one is at fault.
Every other path is relayed to the engine unchanged. ilre's own endpoints live under /ilre/;
/ilre/readyz is ready while the model is loaded and the engine passed its latest health check.
Every 4xx/5xx answer, the sidecar's own or the engine's relayed, is logged once (logger ilre.sidecar).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Callable

from opentelemetry.trace import SpanKind
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route

from ...contract.conversation import NotReadable, read_conversation
from ...contract.messages import CompressRequest, CompressResult, InputError
from ..common import tracing
from ..common.config import SidecarConfig
from ..common.errors import Code, HTTP_STATUS, ServiceError
from ..common.keys import ANONYMOUS, KeyPolicy, UNAUTHENTICATED_MESSAGE
from ..common.quotas import retry_after_header
from ..common.request_log import request_id
from ..common.stopping import STOP_STEP_S, cancel_until_done
from ..transport.chat_compression import compress_chat
from ..transport.frontend import Frontend
from ..transport.http_app import build_app
from ..transport.http_common import decode_json, parse_timeout, read_body, unless_disconnected
from .formats import FORMATS, Prompt, RouteFormat
from .history import FrozenTexts
from .options import BODY_FIELD, CompressionOptions
from .plan import Forwarded, engine_error, error_message, ms, passed_through, report
from .prompt import PromptSplitter, Split
from .retrieve import MARKER, encode, next_body, prepare
from .tool_dialects import DIALECTS
from .upstream import PROBE_TEXT, Upstream, UpstreamError, UpstreamHealth, response_headers

log = logging.getLogger(__name__)
failures = logging.getLogger("ilre.sidecar")

OPEN_PATHS = ("/health", "/ilre/healthz", "/ilre/readyz", "/ilre/metrics")  # probes need no API key
TOKENIZER_MATCHES = "the engine's tokenizer gives the compressor's token IDs for a probe text"
TOKENIZER_DIFFERS = "the engine's tokenizer differs from the compressor's (a probe text gives other token IDs)"
PROBE_TIMEOUT_S = 10.0  # the longest the tokenizer probe of the engine may take (less when the deadline is nearer)


class Sidecar:
    """A compressing proxy in front of one engine. `splitter` holds the compressor's tokenizer."""

    def __init__(self, frontend: Frontend, config: SidecarConfig, splitter: PromptSplitter,
                 defaults: CompressionOptions):
        self.frontend, self.config, self.splitter, self.defaults = frontend, config, splitter, defaults
        self.upstream = Upstream(config.engine_url, config.engine_api, config.connect_timeout_s)
        self.health = UpstreamHealth(self.upstream, config.engine_health_interval_s, config.engine_health_timeout_s)
        self.metrics = frontend.metrics
        self._forward: str | None = None if config.forward == "auto" else config.forward
        self.forward_reason = None if self._forward is None else f"forward = {self._forward} (the setting)"
        self._budget: int | None = None  # the engine's default budget, once known
        self.frozen = FrozenTexts(config.history_mb << 20)  # history mode frozen: what each message was sent as
        self._health_task: asyncio.Task | None = None

    async def start(self) -> None:
        """Check the engine's health in the background, now and then every interval (/ilre/readyz
        is 503 until the first check has passed)."""
        self._health_task = asyncio.create_task(self.health.run())

    async def close(self) -> None:
        """Stop the health checks, then close the engine connections; neither can hang the stop (service/common/
        stopping.py: each is cancelled again while it has not ended, then left behind with a warning)."""
        if self._health_task is not None and not await cancel_until_done(self._health_task):
            log.warning("engine %s: the health check did not end when cancelled; left behind", self.upstream.base_url)
        if not await cancel_until_done(asyncio.create_task(self.upstream.close()), grace_s=STOP_STEP_S):
            log.warning("engine %s: its connections did not close; left behind", self.upstream.base_url)

    async def readyz(self, request: Request) -> Response:
        """Ready = the compressor's model is loaded and the engine passed its latest health check."""
        model = await self.frontend.ready()
        engine = {**self.health.report(), "forward": self._forward, "forward_reason": self.forward_reason}
        ready = model and self.health.healthy
        return JSONResponse({"ready": ready, "model_loaded": model, "queue": self.frontend.queue.kind, "engine": engine},
                            status_code=200 if ready else 503)

    async def forward_mode(self, deadline: float | None = None) -> str:
        """ids when the engine's tokenizer gives our IDs for a probe text, else text (checked once;
        an engine that cannot be reached yet, or not before the request's `deadline`, is asked again
        on the next request)."""
        if self._forward is None:
            ours = self.splitter.tokenizer(PROBE_TEXT, add_special_tokens=False).input_ids
            left = PROBE_TIMEOUT_S if deadline is None else min(PROBE_TIMEOUT_S, max(deadline - time.monotonic(), 0.001))
            try:
                theirs = await self.upstream.tokenize(PROBE_TEXT, left)
            except UpstreamError:
                return "ids"  # unreachable or slow: the request fails at the engine anyway; decide next time
            self._forward = "ids" if theirs == list(ours) else "text"
            self.forward_reason = (TOKENIZER_MATCHES if self._forward == "ids" else TOKENIZER_DIFFERS)
            log.info("engine %s: tokenizer %s ours: forwarding %s", self.config.engine_url,
                     "matches" if self._forward == "ids" else "differs from", self._forward)
        return self._forward

    # -- one request ---------------------------------------------------------------------------
    async def handle(self, request: Request, fmt: RouteFormat) -> Response:
        """One engine request: its span (`ilre.sidecar`, under the caller's traceparent) and its
        request id (the caller's x-request-id, or a new one), returned as x-ilre-request-id."""
        try:
            rid = request_id(request.headers.get("x-request-id"))
        except ServiceError as exc:
            return self._error(fmt.name, exc, request_id(None))
        attributes = {"http.route": fmt.path, "ilre.request_id": rid}
        with tracing.tracer().start_as_current_span("ilre.sidecar", context=tracing.extract(dict(request.headers)),
                                                    kind=SpanKind.SERVER, attributes=attributes):
            response = await self._handle(request, fmt, rid)
        response.headers["x-ilre-request-id"] = rid
        return response

    async def _handle(self, request: Request, fmt: RouteFormat, rid: str) -> Response:
        try:
            raw = await read_body(request, self.frontend.config.max_message_bytes)
            data = decode_json(raw)
            if not isinstance(data, dict):
                raise ServiceError(Code.INVALID_ARGUMENT, "request: must be a JSON object", "request")
            timeout = parse_timeout(request.headers.get("x-request-timeout")) or self.config.engine_timeout_s
            options = self.defaults.resolve(request.headers, data.get(BODY_FIELD))
            self._request(options, [0], [0])  # bad options fail even where the prompt would pass through
        except InputError as exc:
            return self._error(fmt.name, ServiceError.from_input(exc), rid)
        except ServiceError as exc:
            return self._error(fmt.name, exc, rid)
        deadline = time.monotonic() + timeout
        body = {k: v for k, v in data.items() if k != BODY_FIELD}
        untouched = raw if BODY_FIELD not in data else json.dumps(body, ensure_ascii=False).encode()
        caller = self.frontend.config.api_keys.identify(request.headers.get("authorization")) or ANONYMOUS
        if not options.enabled:
            plan = Forwarded(fmt.path, untouched, "off")
        else:
            work = asyncio.ensure_future(self._plan(fmt, body, untouched, options, deadline, caller, rid))
            try:
                plan = await unless_disconnected(request, work)
            except InputError as exc:
                return self._error(fmt.name, ServiceError.from_input(exc), rid)
            except ServiceError as exc:
                return self._error(fmt.name, exc, rid)
            if plan is None:
                return self._cancelled(rid, fmt.name, "the client closed the connection during compression")
        self.metrics.sidecar_requests.labels(fmt.name, plan.action).inc()
        if plan.cause is not None:
            self.metrics.sidecar_passthrough.labels(plan.cause).inc()
            field = f" ({plan.field})" if plan.field else ""
            log.info("passthrough %s request_id=%s: %s%s", fmt.name, rid, plan.reason, field,
                     extra={"fields": {"request_id": rid, "route": fmt.name, "cause": plan.cause, "field": plan.field}})
        if plan.original_tokens is not None:
            self.metrics.sidecar_tokens.labels("original").inc(plan.original_tokens)
            self.metrics.sidecar_tokens.labels("forwarded").inc(plan.forwarded_tokens)
        if plan.rounds is not None:
            return await self.relay_rounds(request, plan, deadline, fmt.name, rid, caller)
        return await self.relay(request, plan, deadline, fmt.name, rid)

    async def _plan(self, fmt: RouteFormat, body: dict[str, Any], untouched: bytes, options: CompressionOptions,
                    deadline: float, caller: KeyPolicy, rid: str) -> Forwarded:
        """Decide what to forward: the untouched body, or one with the compressed prompt."""
        if fmt.conversation:
            return await self._plan_conversation(fmt, body, untouched, options, deadline, caller, rid)
        start = time.perf_counter()
        prompt = fmt.prompt(body)
        if prompt is None:
            return passed_through(fmt, untouched, "no_prompt", "no single text or token-ID prompt")
        mode = await self.forward_mode(deadline)
        if prompt.ids is not None and mode == "text":
            return passed_through(fmt, untouched, "other_tokenizer", "token IDs of another tokenizer")
        split = await asyncio.to_thread(self._split, prompt, options)
        if not split.query or not split.context:
            return passed_through(fmt, untouched, "no_context", "no context before the query", split.total, start)
        request = self._request(options, split.context, split.query)
        if len(split.context) <= request.budget_for(len(split.context), await self._default_budget()):
            return passed_through(fmt, untouched, "fits_budget", "fits the budget", split.total, start)
        result = (await self.frontend.compress(request, max(deadline - time.monotonic(), 0.0), f"sidecar.{fmt.name}",
                                               caller=caller, rid=rid)).results[0]
        ids = split.prefix + result.token_ids
        if mode == "ids":
            path, out = fmt.with_ids(body, ids)
        else:
            path, out = fmt.with_text(body, self.splitter.decode(result.token_ids))
        return Forwarded(path, json.dumps(out, ensure_ascii=False).encode(), "compressed", split.total, len(ids),
                         ms(start), reason=None if mode == "ids" else f"forwarded as text: {self.forward_reason}")

    async def _plan_conversation(self, fmt: RouteFormat, body: dict[str, Any], untouched: bytes,
                                 options: CompressionOptions, deadline: float, caller: KeyPolicy, rid: str) -> Forwarded:
        """A conversation compressed message by message (service/transport/chat_compression.py), the same
        rules as the gateway's: tool results and long documents compressed for the live question, the rest
        byte for byte; forwarded to the same route as messages. Counts are the text messages' tokens."""
        start = time.perf_counter()
        try:
            conversation = read_conversation(fmt.conversation, body)
        except NotReadable as exc:
            return passed_through(fmt, untouched, "not_readable", str(exc), field=exc.field)
        default = await self._default_budget()
        sizing = self._request(options, [0], [0])
        fields = {"granularity": "unit", **{k: v for k, v in options.request_fields().items() if k not in ("budget", "ratio")}}

        async def call(request: dict[str, Any]) -> CompressResult:
            outcome = await self.frontend.compress(request, max(deadline - time.monotonic(), 0.0), f"sidecar.{fmt.name}",
                                                   many=False, caller=caller, rid=rid)
            return outcome.results[0]

        async def call_many(request: dict[str, Any]) -> list[CompressResult]:
            outcome = await self.frontend.compress(request, max(deadline - time.monotonic(), 0.0), f"sidecar.{fmt.name}",
                                                   caller=caller, rid=rid)
            return outcome.results

        done = await compress_chat(call, conversation.messages, lambda total: sizing.budget_for(total, default),
                                   fields=fields, frozen=self.frozen if options.history == "frozen" else None,
                                   call_many=call_many)
        if not done.compressed:
            return passed_through(fmt, untouched, "fits_budget", "fits the budget", done.before, start)
        rounds = options.retrieve_rounds
        notes = {c.index: MARKER.format(kept=c.after, original=c.before, hash=c.hash) if rounds else "" for c in done.compressed}
        out = conversation.write(body, {c.index: notes[c.index] + c.text for c in done.compressed})
        return Forwarded(fmt.path, encode(out), "compressed", done.before, done.after, ms(start),
                         rounds=prepare(DIALECTS[fmt.conversation], out, [c.hash for c in done.compressed], done.query, rounds)
                         if rounds else None)

    async def _default_budget(self) -> int:
        """The budget the engine behind the queue applies to a request that names none (its configuration,
        read once from its model info)."""
        if self._budget is None:
            self._budget = (await self.frontend.model_info()).default_budget
        return self._budget

    def _request(self, options: CompressionOptions, context: list[int], query: list[int]) -> CompressRequest:
        """The compression request for a split; InputError names the option as the client wrote it."""
        try:
            return self.frontend.build_request({"context_ids": context, "query_ids": query, **options.request_fields()})
        except InputError as exc:
            raise InputError(f"{BODY_FIELD}.{exc.field}", str(exc).partition(": ")[2]) from None

    def _split(self, prompt: Prompt, options: CompressionOptions) -> Split:
        ids = prompt.ids if prompt.ids is not None else self.splitter.text_ids(prompt.text)
        return self.splitter.plain(ids, options.query_tokens, from_text=prompt.ids is None)

    # -- the engine ----------------------------------------------------------------------------
    async def relay(self, request: Request, plan: Forwarded, deadline: float, route: str, rid: str) -> Response:
        """Send `plan` to the engine and stream its answer back (no buffering but the chat reshape and
        the engine's error answers, which are read whole to log their cause)."""
        opened = time.perf_counter()
        work = asyncio.ensure_future(self.upstream.open(request.method, plan.path, request.url.query, request.headers,
                                                        plan.content, max(deadline - time.monotonic(), 0.001)))
        attributes = {"server.address": self.config.engine_url, "url.path": plan.path, "ilre.action": plan.action}
        with tracing.tracer().start_as_current_span("ilre.forward", kind=SpanKind.CLIENT, attributes=attributes) as span:
            try:  # the span lasts until the engine's answer starts (its body streams on after)
                response = await unless_disconnected(request, work)
            except UpstreamError as exc:
                span.set_attribute("http.response.status_code", exc.status)
                return self._unreachable(exc, route, rid)
            if response is not None:
                span.set_attribute("http.response.status_code", response.status_code)
        if response is None:  # the client went away before the engine answered: request cancelled
            return self._cancelled(rid, route, "the client closed the connection before the engine answered")
        self.metrics.sidecar_engine_latency.labels(route).observe(time.perf_counter() - opened)
        headers = {**response_headers(response, rewritten=False), **report(plan)}
        if response.status_code >= 400:
            body = b"".join([chunk async for chunk in self.upstream.body(response)])
            return self._refused(response, body, headers, plan.path, route, rid)
        return StreamingResponse(self.upstream.body(response), status_code=response.status_code, headers=headers)

    async def relay_rounds(self, request: Request, plan: Forwarded, deadline: float, route: str, rid: str,
                           caller: KeyPolicy) -> Response:
        """The retrieve loop (retrieve.py): ask the engine (not streamed), answer its calls of the retrieve
        tool from the document cache, ask again; the last answer in the API's shape, streamed if asked."""
        state = plan.rounds
        assert state is not None
        body, answer = state.body, {}
        for round_ in range(state.rounds + 1):
            if round_ == state.rounds:
                body = state.dialect.withdraw(body)  # the last round: the engine must answer
            with tracing.tracer().start_as_current_span("ilre.forward", kind=SpanKind.CLIENT, attributes={
                    "server.address": self.config.engine_url, "url.path": plan.path, "ilre.round": round_}):
                try:
                    response = await self.upstream.open("POST", plan.path, request.url.query, request.headers, encode(body),
                                                        max(deadline - time.monotonic(), 0.001))
                except UpstreamError as exc:
                    return self._unreachable(exc, route, rid)
                raw = b"".join([chunk async for chunk in self.upstream.body(response, decoded=True)])
            headers = {**response_headers(response, rewritten=True), **report(plan), "x-ilre-retrieve-calls": str(state.calls)}
            if response.status_code >= 400:
                return self._refused(response, raw, headers, plan.path, route, rid)
            try:
                answer = json.loads(raw)
            except ValueError:
                message = f"engine: {self.config.engine_url}{plan.path} answered {response.status_code} with a body that is not JSON"
                self.log_failure(502, rid, route, message)
                return engine_error(502, message)
            following = None if round_ == state.rounds else await next_body(
                state, answer, self.frontend, caller, rid, deadline, lambda o: self.metrics.sidecar_retrieves.labels(o).inc())
            if following is None:
                break
            body = following
        answer = state.dialect.strip(answer)
        headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
        headers["x-ilre-retrieve-calls"] = str(state.calls)
        if state.stream:
            return StreamingResponse(iter(list(state.dialect.stream(answer))), media_type="text/event-stream", headers=headers)
        return JSONResponse(answer, headers=headers)

    def _unreachable(self, exc: UpstreamError, route: str, rid: str) -> Response:
        """The engine could not be reached or did not answer in time: 502/504, counted and logged."""
        self.metrics.sidecar_engine_errors.labels("timeout" if exc.status == 504 else "unreachable").inc()
        self.log_failure(exc.status, rid, route, exc.message)
        return engine_error(exc.status, exc.message)

    def _refused(self, response: Any, body: bytes, headers: dict[str, str], path: str, route: str, rid: str) -> Response:
        """The engine's own error answer, relayed as it came, counted and logged with its cause."""
        self.metrics.sidecar_engine_errors.labels(f"status_{response.status_code // 100}xx").inc()
        cause = error_message(body, headers.get("content-encoding"))
        self.log_failure(response.status_code, rid, route, f"the engine answered {path}: {cause}")
        return Response(body, status_code=response.status_code, headers=headers)

    async def passthrough(self, request: Request) -> Response:
        """Any other path: the request as it came (body streamed), the answer as it comes."""
        try:
            rid = request_id(request.headers.get("x-request-id"))
        except ServiceError:
            rid = request_id(None)  # not ours to refuse: the engine sees the caller's header as it came
        if request.url.path.startswith("/ilre/"):
            message = f"path: {request.url.path} is not an ilre endpoint (see /ilre/v1/model)"
            self.log_failure(404, rid, "other", message)
            response = engine_error(404, message)
        else:
            deadline = time.monotonic() + self.config.engine_timeout_s
            bodyless = request.headers.get("content-length", "0") == "0" and "transfer-encoding" not in request.headers
            content = None if bodyless else request.stream()  # None can be sent twice (Upstream.open)
            response = await self.relay(request, Forwarded(request.url.path, content, "other"), deadline, "other", rid)
        response.headers["x-ilre-request-id"] = rid
        return response

    def _error(self, route: str, exc: ServiceError, rid: str) -> Response:
        self.metrics.sidecar_requests.labels(route, "error").inc()
        self.frontend.record_error(exc.code)
        self.log_failure(exc.http_status, rid, route, exc.message)
        response = engine_error(exc.http_status, exc.message, exc.field, exc.code.value)
        if exc.retry_after_s is not None:
            response.headers["retry-after"] = retry_after_header(exc.retry_after_s)
        return response

    def _cancelled(self, rid: str, route: str, cause: str) -> Response:
        self.log_failure(HTTP_STATUS[Code.CANCELLED], rid, route, cause)
        return Response(status_code=HTTP_STATUS[Code.CANCELLED])

    def log_failure(self, status: int, rid: str, route: str, cause: str) -> None:
        """The one log line of a 4xx/5xx answer: request id, route, engine URL, cause."""
        fields = {"request_id": rid, "route": route, "status": status, "engine_url": self.config.engine_url,
                  "cause": cause}
        failures.warning("%d %s request_id=%s engine=%s: %s", status, route, rid, self.config.engine_url, cause,
                         extra={"fields": fields})


def build_sidecar_app(sidecar: Sidecar) -> Starlette:
    """The ASGI app: the four compressible routes, ilre's endpoints under /ilre, the rest relayed."""
    keys = sidecar.frontend.config.api_keys

    def route(fmt: RouteFormat) -> Callable:
        async def endpoint(request: Request) -> Response:
            return await sidecar.handle(request, fmt)
        return endpoint

    async def guarded(scope, receive, send) -> None:
        if scope["type"] == "http" and keys.enabled and not scope["path"].startswith(OPEN_PATHS):
            request = Request(scope, receive)
            if not keys.check(request.headers.get("authorization")):
                sidecar.frontend.record_error(Code.UNAUTHENTICATED)
                sidecar.log_failure(401, request_id(None), scope["path"], UNAUTHENTICATED_MESSAGE)
                await engine_error(401, UNAUTHENTICATED_MESSAGE, "authorization", Code.UNAUTHENTICATED.value)(scope, receive, send)
                return
        await app(scope, receive, send)

    routes = [Route(fmt.path, route(fmt), methods=["POST"]) for fmt in FORMATS]
    routes += [Route("/ilre/readyz", sidecar.readyz), Mount("/ilre", app=build_app(sidecar.frontend)),
               Route("/{path:path}", sidecar.passthrough, methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"])]
    app = Starlette(routes=routes)
    return guarded
