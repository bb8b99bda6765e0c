"""Service configuration, built once per process from an injectable environment plus overrides.

Every field below is a declared setting (contract/settings.py): its flag, its environment variable
`ILRE_<NAME>`, its bounds and its line of help live on the field, and `ilre serve|worker|sidecar --help`
and README's settings table are made from them. `ServiceConfig.from_env(os.environ, grpc_port=...)`: an
override that is None falls back to the environment variable, then to the field's default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ...contract.defaults import MAX_CONTEXT_TOKENS, MAX_QUERY_TOKENS, QUERY_TOKENS
from ...contract.document_ids import MIN_SECRET_CHARS
from ...contract.settings import SERVERS, check_settings, from_settings, setting
from .errors import ConfigError
from .keys import ApiKeys
from .redis_url import parse_redis_url

FRONT_ENDS = ("serve", "sidecar")  # the commands that accept requests
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
TRACING_MODES = ("off", "otlp", "console")
ENGINE_APIS = ("sglang", "openai", "llamacpp")
FORWARD_MODES = ("auto", "ids", "text")
HISTORY_MODES = ("fresh", "frozen")  # sidecar/history.py
MAX_RETRIEVE_ROUNDS = 8  # sidecar/retrieve.py


@dataclass(frozen=True)
class ServiceConfig:
    """Every knob of the service processes (front end, worker, sidecar)."""

    host: str = setting("127.0.0.1", "listen address (0.0.0.0 in containers; the worker's: of --metrics-port)", SERVERS)
    grpc_port: int = setting(50051, "gRPC port (0 = any free port)", ("serve",), minimum=0, maximum=65535,
                             what="a port")
    http_port: int = setting(8080, "HTTP port: health, metrics, JSON, the sidecar's API (0 = any free port)",
                             FRONT_ENDS, minimum=0, maximum=65535, what="a port", flag_for=(("sidecar", "--port"),))
    redis_url: str | None = setting(None, "redis://HOST:PORT/DB, or redis+sentinel://HOST:PORT[,...]/MASTER[/DB]: "
                                    "queue on Redis (none: the in-process queue; a worker needs it)", SERVERS)
    redis_prefix: str = setting("ilre", "key prefix on Redis", SERVERS, advanced=True)
    redis_wait_replicas: int = setting(-1, "replicas that must hold a request before it is accepted, and a "
                                       "document's IDs before its document_id is answered (Redis WAIT)",
                                       SERVERS, minimum=-1, shown_default="1 with redis+sentinel://, else 0",
                                       advanced=True)
    redis_wait_ms: int = setting(1000, "how long an enqueue waits for those replicas, then UNAVAILABLE (a worker "
                                 "storing IDs: then logs and counts them at risk)", SERVERS, minimum=1, advanced=True)
    max_batch: int = setting(8, "requests per batch", SERVERS, minimum=1)
    max_wait_ms: float = setting(5.0, "how long a batch waits to fill up, in ms", SERVERS, minimum=0)
    max_queue: int = setting(256, "accepted unfinished requests before RESOURCE_EXHAUSTED / 429", FRONT_ENDS, minimum=1)
    request_timeout_s: float = setting(300.0, "deadline of requests that bring none, in s", ("serve",), above=0)
    max_message_bytes: int = setting(16 << 20, "largest gRPC message / HTTP body", FRONT_ENDS, minimum=1)
    max_context_bytes: int = setting(64 << 20, "largest context a CompressStream assembles", ("serve",), minimum=1,
                                     advanced=True)
    max_context_tokens: int = MAX_CONTEXT_TOKENS  # the engine's setting (engine/engine_settings.py), passed on
    api_keys_file: str | None = setting(None, "accepted API keys, one per line, with optional limits (see also "
                                        "ILRE_API_KEYS)", FRONT_ENDS)
    api_keys: ApiKeys = setting(help="accepted API keys, comma-separated (none: no authentication)",
                                commands=FRONT_ENDS, flag=None, secret=True, parse=ApiKeys.from_text,
                                default_factory=ApiKeys)
    document_secret: str | None = setting(None, f"keys the document ids, at least {MIN_SECRET_CHARS} characters "
                                          "(none: generated, kept on Redis by the workers)", SERVERS, flag=None,
                                          secret=True)
    tls_cert: str | None = setting(None, "PEM certificate chain: serve TLS (with --tls-key)", FRONT_ENDS)
    tls_key: str | None = setting(None, "PEM private key of --tls-cert", FRONT_ENDS)
    tls_client_ca: str | None = setting(None, "PEM CA of client certificates: mutual TLS", ("serve",))
    shutdown_grace_s: float = setting(10.0, "seconds in-flight requests get on SIGTERM", FRONT_ENDS, minimum=0)
    http_keep_alive_s: float = setting(75.0, "seconds an idle HTTP client connection stays open (above a load "
                                       "balancer's idle timeout)", FRONT_ENDS, above=0, advanced=True)
    redis_retry_s: float = setting(5.0, "how long a waiting request (and a worker's read or write of a document's "
                                   "IDs) rides out a Redis outage", SERVERS, minimum=0,
                                   advanced=True)
    threads: int | None = setting(None, "torch CPU threads", SERVERS, parse=int, minimum=1,
                                  shown_default="torch's choice")
    log_format: str = setting("text", "json: one JSON object per log line, and one line per request", SERVERS,
                              choices=LOG_FORMATS)
    log_level: str | None = setting(None, "debug, info, warning or error", SERVERS, choices=LOG_LEVELS,
                                    shown_default="info with json, warning with text")
    tracing: str = setting("off", "OpenTelemetry spans: otlp exports to OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, "
                           "console prints them", SERVERS, choices=TRACING_MODES)
    worker_name: str | None = setting(None, "the worker's consumer name in the group", ("worker",), flag="--name",
                                      shown_default="host-pid-random")
    metrics_port: int | None = setting(None, "serve the worker's Prometheus metrics on this port", ("worker",),
                                       parse=int, minimum=0, maximum=65535, what="a port")
    claim_idle_ms: int = setting(30000, "reclaim the entries of a worker silent this long", ("worker",), minimum=1,
                                 advanced=True)
    max_attempts: int = setting(3, "deliveries before a request goes to the dead letters", ("worker",), minimum=1,
                                advanced=True)
    heartbeat_s: float = setting(5.0, "the worker's registration refresh period (its TTL is 3x)", ("worker",),
                                 above=0, advanced=True)
    doc_cache_shared_mb: int = setting(2048, "document cache shared by all workers on Redis, in MiB (0 = off)",
                                       ("worker",), minimum=0)
    doc_cache_ttl_s: int = setting(3600, "a shared document entry expires this many seconds after its last use",
                                   ("worker",), above=0, advanced=True)

    def __post_init__(self) -> None:
        check_settings(self, ConfigError)
        if self.max_context_tokens < 1:
            raise ConfigError(f"max_context_tokens: must be >= 1 (got {self.max_context_tokens})")
        if self.document_secret is not None and len(self.document_secret) < MIN_SECRET_CHARS:
            raise ConfigError(f"document_secret: must be at least {MIN_SECRET_CHARS} characters "
                              f"(got {len(self.document_secret)}; e.g. `openssl rand -hex 32`)")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert: give both tls_cert and tls_key, or neither")
        if self.tls_client_ca and not self.tls_cert:
            raise ConfigError("tls_client_ca: mutual TLS needs tls_cert and tls_key too")
        if self.redis_url is not None:
            parse_redis_url(self.redis_url)

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)

    @property
    def wait_replicas(self) -> int:
        """Replicas an enqueue (and a worker's write of IDs) waits for: redis_wait_replicas, or its default for the
        URL's kind."""
        if self.redis_wait_replicas >= 0:
            return self.redis_wait_replicas
        return 1 if self.redis_url and parse_redis_url(self.redis_url).sentinel else 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: Any) -> "ServiceConfig":
        """Overrides (None = not given) beat ILRE_* variables, which beat the defaults."""
        values = from_settings(cls, environ, overrides, error=ConfigError)
        values["api_keys"] = values.get("api_keys", ApiKeys()).with_file(values["api_keys_file"])
        return cls(**values)


@dataclass(frozen=True)
class SidecarConfig:
    """The engine behind `ilre sidecar`."""

    engine_url: str = setting("http://127.0.0.1:30000", "the engine's base URL", ("sidecar",))
    engine_api: str = setting("sglang", "the engine's API: openai = vLLM or any OpenAI-compatible server",
                              ("sidecar",), choices=ENGINE_APIS)
    forward: str = setting("auto", "send the engine token IDs or text; auto = IDs when its tokenizer is ours",
                           ("sidecar",), choices=FORWARD_MODES)
    engine_timeout_s: float = setting(600.0, "deadline of a request without x-request-timeout: compression plus "
                                      "the engine's answer, in s", ("sidecar",), above=0)
    connect_timeout_s: float = setting(5.0, "connecting to the engine, in s", ("sidecar",), above=0, advanced=True)
    engine_health_interval_s: float = setting(5.0, "seconds between health checks of the engine; /ilre/readyz is "
                                              "ready while the latest one passed", ("sidecar",), above=0,
                                              advanced=True)
    engine_health_timeout_s: float = setting(20.0, "seconds one health check of the engine may take (SGLang answers "
                                             "after its running batch's next step)", ("sidecar",), above=0,
                                             advanced=True)
    query_tokens: int = setting(QUERY_TOKENS, "plain prompts: the last N tokens are the query", ("sidecar",),
                                minimum=1, maximum=MAX_QUERY_TOKENS)
    history: str = setting("fresh", "conversations: fresh = each message compressed for the live question; frozen = "
                           "compressed once, then sent the same on every later step (the engine's prefix cache hits)",
                           ("sidecar",), choices=HISTORY_MODES)
    retrieve_rounds: int = setting(0, "conversations: rounds of ilre_retrieve calls the sidecar answers itself per "
                                   "request (0 = the tool is not offered)", ("sidecar",), minimum=0, maximum=MAX_RETRIEVE_ROUNDS)
    history_mb: int = setting(64, "MiB of sent texts kept for history mode frozen (least recently used out first)",
                              ("sidecar",), minimum=1, advanced=True)

    def __post_init__(self) -> None:
        check_settings(self, ConfigError)
        if not self.engine_url.startswith(("http://", "https://")):
            raise ConfigError(f"engine_url: must start with http:// or https:// (got {self.engine_url!r})")

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: Any) -> "SidecarConfig":
        """Overrides (None = not given) beat ILRE_* variables, which beat the defaults."""
        return cls(**from_settings(cls, environ, overrides, error=ConfigError))
