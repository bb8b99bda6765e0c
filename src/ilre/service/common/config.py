"""Service configuration, built once per process from an injectable environment plus overrides.

`ServiceConfig.from_env(os.environ, grpc_port=...)`: an override that is None falls back to the
environment variable, then to the field's default. Used by `ilre serve` (front end) and
`ilre worker` (the Redis fields and the worker fields).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from ...engine.defaults import MAX_CONTEXT_TOKENS, MAX_QUERY_TOKENS, QUERY_TOKENS
from ...engine.document_ids import MIN_SECRET_CHARS
from .errors import ConfigError
from .keys import ApiKeys
from .redis_url import parse_redis_url


@dataclass(frozen=True)
class ServiceConfig:
    """Every knob of the service; each field's environment variable is ILRE_<NAME upper-cased>."""

    host: str = "127.0.0.1"               # listen address of both servers (0.0.0.0 in containers)
    grpc_port: int = 50051                # 0 = any free port
    http_port: int = 8080                 # health, metrics, JSON mirror; 0 = any free port
    redis_url: str | None = None          # None = the in-process batcher
    redis_prefix: str = "ilre"            # key prefix of the stream, group, results
    redis_wait_replicas: int = -1         # replicas that must hold a request before it counts as accepted
                                          # (Redis WAIT); -1 = 1 with Sentinel, 0 (no wait) otherwise
    redis_wait_ms: int = 1000             # how long an enqueue waits for them; then UNAVAILABLE (retryable)
    max_batch: int = 8                    # requests per batch
    max_wait_ms: float = 5.0              # how long a batch waits to fill up
    max_queue: int = 256                  # accepted but unfinished requests; more = RESOURCE_EXHAUSTED
    request_timeout_s: float = 300.0      # deadline of a request that brings none
    max_message_bytes: int = 16 << 20     # one gRPC message / one HTTP body
    max_context_bytes: int = 64 << 20     # a context assembled by CompressStream
    max_context_tokens: int = MAX_CONTEXT_TOKENS  # context token IDs a stream may carry (the engine checks text)
    api_keys: ApiKeys = field(default_factory=ApiKeys, repr=False)  # empty = no authentication
    document_secret: str | None = field(default=None, repr=False)  # keys the document ids; None = generated
                                          # (kept on Redis by the workers; in process without Redis)
    tls_cert: str | None = None           # PEM server certificate chain; with tls_key turns TLS on
    tls_key: str | None = None
    tls_client_ca: str | None = None      # PEM CA of client certificates: mutual TLS
    shutdown_grace_s: float = 10.0        # in-flight requests get this long on SIGTERM
    http_keep_alive_s: float = 75.0       # an idle HTTP client connection stays open this long: longer than
                                          # clients' pools keep one (httpx 5 s) and load balancers' idle timeouts
    redis_retry_s: float = 5.0            # a waiting request rides out a Redis outage this long
    claim_idle_ms: int = 30000            # worker: reclaim entries idle this long (their worker died)
    max_attempts: int = 3                 # worker: deliveries before an entry goes to the dead letters
    heartbeat_s: float = 5.0              # worker: registration refresh period (TTL = 3x)
    doc_cache_shared_mb: int = 2048       # worker: the document cache shared on Redis; 0 = off
    doc_cache_ttl_s: int = 3600           # worker: a shared document entry expires this long after its last use

    def __post_init__(self) -> None:
        for name in ("grpc_port", "http_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ConfigError(f"{name}: must be a port in 0..65535 (got {getattr(self, name)})")
        for name in ("max_batch", "max_queue", "max_message_bytes", "max_context_bytes",
                     "max_context_tokens", "max_attempts", "claim_idle_ms", "redis_wait_ms"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be >= 1 (got {getattr(self, name)})")
        for name in ("max_wait_ms", "shutdown_grace_s", "redis_retry_s", "doc_cache_shared_mb"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: must be >= 0 (got {getattr(self, name)})")
        for name in ("request_timeout_s", "heartbeat_s", "doc_cache_ttl_s", "http_keep_alive_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}: must be > 0 (got {getattr(self, name)})")
        if self.document_secret is not None and len(self.document_secret) < MIN_SECRET_CHARS:
            raise ConfigError(f"document_secret: must be at least {MIN_SECRET_CHARS} characters "
                              f"(got {len(self.document_secret)}; e.g. `openssl rand -hex 32`)")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert: give both tls_cert and tls_key, or neither")
        if self.tls_client_ca and not self.tls_cert:
            raise ConfigError("tls_client_ca: mutual TLS needs tls_cert and tls_key too")
        if self.redis_url is not None:
            parse_redis_url(self.redis_url)
        if self.redis_wait_replicas < -1:
            raise ConfigError(f"redis_wait_replicas: must be >= 0, or -1 for 1 with Sentinel and 0 without "
                              f"(got {self.redis_wait_replicas})")

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)

    @property
    def wait_replicas(self) -> int:
        """Replicas an enqueue waits for: redis_wait_replicas, or its default for the URL's kind."""
        if self.redis_wait_replicas >= 0:
            return self.redis_wait_replicas
        return 1 if self.redis_url and parse_redis_url(self.redis_url).sentinel else 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: Any) -> "ServiceConfig":
        """Overrides (None = not given) beat ILRE_* variables, which beat the defaults."""
        keys_file = overrides.pop("api_keys_file", None)
        values = _values(cls, environ, overrides, skip=("api_keys",))
        values["api_keys"] = ApiKeys.load(environ, keys_file)
        return cls(**values)


ENGINE_APIS = ("sglang", "openai", "llamacpp")
FORWARD_MODES = ("auto", "ids", "text")


@dataclass(frozen=True)
class SidecarConfig:
    """The engine behind `ilre sidecar`; each field's environment variable is ILRE_<NAME upper-cased>."""

    engine_url: str = "http://127.0.0.1:30000"   # the engine's base URL
    engine_api: str = "sglang"                   # sglang | openai (vLLM and other OpenAI servers) | llamacpp
    forward: str = "auto"                        # ids | text | auto (ids when the engine's tokenizer is ours)
    engine_timeout_s: float = 600.0              # deadline of a request that brings no x-request-timeout
    connect_timeout_s: float = 5.0               # connecting to the engine
    engine_health_interval_s: float = 5.0        # GET /health of the engine this often (/ilre/readyz reads it)
    engine_health_timeout_s: float = 20.0        # ... each allowed this long (SGLang's own check waits 20 s)
    query_tokens: int = QUERY_TOKENS             # plain prompts: the last N tokens are the query

    def __post_init__(self) -> None:
        if not self.engine_url.startswith(("http://", "https://")):
            raise ConfigError(f"engine_url: must start with http:// or https:// (got {self.engine_url!r})")
        if self.engine_api not in ENGINE_APIS:
            raise ConfigError(f"engine_api: must be one of {', '.join(ENGINE_APIS)} (got {self.engine_api!r})")
        if self.forward not in FORWARD_MODES:
            raise ConfigError(f"forward: must be one of {', '.join(FORWARD_MODES)} (got {self.forward!r})")
        for name in ("engine_timeout_s", "connect_timeout_s", "engine_health_interval_s", "engine_health_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}: must be > 0 (got {getattr(self, name)})")
        if not 1 <= self.query_tokens <= MAX_QUERY_TOKENS:
            raise ConfigError(f"query_tokens: must be in 1..{MAX_QUERY_TOKENS} (got {self.query_tokens})")

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: Any) -> "SidecarConfig":
        """Overrides (None = not given) beat ILRE_* variables, which beat the defaults."""
        return cls(**_values(cls, environ, overrides))


def _values(cls: type, environ: Mapping[str, str], overrides: dict[str, Any], skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Field values of dataclass `cls`: an override, else ILRE_<NAME> parsed to the field's type."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        given = overrides.pop(f.name, None)
        raw = environ.get(f"ILRE_{f.name.upper()}")
        if given is not None:
            values[f.name] = given
        elif raw not in (None, ""):
            values[f.name] = _parse(f"ILRE_{f.name.upper()}", raw, f.default)
    if overrides:
        raise TypeError(f"unknown settings: {', '.join(sorted(overrides))}")
    return values

def _parse(name: str, raw: str, default: Any) -> Any:
    kind = type(default) if default is not None else str
    try:
        return kind(raw)
    except ValueError:
        raise ConfigError(f"{name}: must be {'an integer' if kind is int else 'a number'} (got {raw!r})") from None
