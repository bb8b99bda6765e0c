"""Redis URLs: a single server, or the master of a Sentinel-managed group (service/common/redis_connection.py
makes the clients).

  redis://[[user]:password@]host:port/db, rediss://..., unix:///path?db=N   one server
  redis+sentinel://[[user]:password@]host:port[,host:port...]/MASTER[/db]   the master Sentinel names

The password in the URL is the data nodes' (master and replicas); sentinels that need one of their
own take `?sentinel_password=...`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit

from .errors import ConfigError

SENTINEL_SCHEME = "redis+sentinel"
SCHEMES = ("redis", "rediss", "unix", SENTINEL_SCHEME)


@dataclass(frozen=True)
class RedisTarget:
    """A parsed --redis-url: `url` as given; for Sentinel, the sentinels' addresses, the master's
    name, the database and the credentials."""

    url: str = field(repr=False)
    sentinels: tuple[tuple[str, int], ...] = ()
    master: str = ""
    db: int = 0
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    sentinel_password: str | None = field(default=None, repr=False)

    @property
    def sentinel(self) -> bool:
        return bool(self.sentinels)

    def redacted(self) -> str:
        """The URL without credentials, for logs and status lines."""
        if self.sentinel:
            hosts = ",".join(f"{h}:{p}" for h, p in self.sentinels)
            return f"{SENTINEL_SCHEME}://{hosts}/{self.master}/{self.db}"
        parts = urlsplit(self.url)
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{parts.hostname or ''}{port}{parts.path}"


def parse_redis_url(url: str) -> RedisTarget:
    """Check and parse a Redis URL (see the module docstring); ConfigError naming `redis_url`."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in SCHEMES:
        raise ConfigError(f"redis_url: must start with redis://, rediss://, unix:// or {SENTINEL_SCHEME}:// "
                          f"(got {RedisTarget(url).redacted()!r})")
    if scheme != SENTINEL_SCHEME:
        return RedisTarget(url)
    rest = url.split("://", 1)[1]
    query = parse_qs(rest.split("?", 1)[1]) if "?" in rest else {}
    rest = rest.split("?", 1)[0]
    auth, _, hosts_path = rest.rpartition("@")
    hosts, _, path = hosts_path.partition("/")
    username, _, password = auth.partition(":") if ":" in auth else ("", "", auth)
    sentinels = []
    for item in filter(None, hosts.split(",")):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"redis_url: sentinel address {item!r} is not host:port (in {SENTINEL_SCHEME}://host:port[,...]/MASTER[/db])")
        sentinels.append((host.strip("[]"), int(port)))
    names = [p for p in path.split("/") if p]
    if not sentinels or not names or len(names) > 2 or (len(names) == 2 and not names[1].isdigit()):
        raise ConfigError(f"redis_url: expected {SENTINEL_SCHEME}://host:port[,host:port...]/MASTER[/db] "
                          f"(got {RedisTarget(url).redacted()!r})")
    return RedisTarget(url, tuple(sentinels), unquote(names[0]), int(names[1]) if len(names) == 2 else 0,
                       unquote(username) or None, unquote(password) or None,
                       (query.get("sentinel_password") or [None])[0])
