"""Optional API keys: `authorization: Bearer <key>` (gRPC metadata or HTTP header), each with a name
for logs and optional limits.

Keys come from ILRE_API_KEYS (comma-separated) and/or a file (ILRE_API_KEYS_FILE or
--api-keys-file): one key per line, `#` comments, then optional settings:

    sk-team-a-0123   name=team-a rate=5 burst=10 queue_share=0.25
    sk-team-a-ci     name=team-a-ci share=team-a
    sk-team-a-9876   name=team-a-new share=team-a
    sk-batch-4567    name=nightly rate=0.5

  name         how logs, traces and metrics call the key (default key-<first 8 hex of its SHA-256>)
  rate         requests per second accepted for this key, on average (default: no limit)
  burst        requests accepted at once above that rate (default: max(1, rate))
  queue_share  the largest share of max_queue this key's unfinished requests may hold, in (0, 1]
  share        a group name: keys with the same group read each other's cached documents (one team's
               keys, or an old and a new key during a rotation); by default a key reads only its own

Cached documents belong to a scope (`KeyPolicy.document_scope`): the key's, its share group's, or
with keys off the one scope every caller shares. A document_id finds nothing outside its scope.

Only SHA-256 digests are kept; a presented key is hashed and compared with every digest in
constant time. Keys are never logged or printed, only their names.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from .errors import ConfigError

UNAUTHENTICATED_MESSAGE = "authorization: missing or invalid API key (send 'authorization: Bearer <key>')"
SETTINGS = ("name", "rate", "burst", "queue_share", "share")


@dataclass(frozen=True)
class KeyPolicy:
    """Who a caller is (`name`, never the key), its limits (None = no limit) and whose documents it reads."""

    name: str
    rate: float | None = None          # requests per second
    burst: int | None = None           # bucket size of the rate limit
    queue_share: float | None = None   # of max_queue
    share: str | None = None           # the group whose documents it shares; None = its own only
    authenticated: bool = True         # False only for ANONYMOUS (keys off)

    @property
    def document_scope(self) -> str:
        """The scope of the documents it stores and finds: "" with keys off (everyone's), else
        "share:<group>" or "key:<name>" (engine/document_names.py)."""
        if not self.authenticated:
            return ""
        return f"share:{self.share}" if self.share else f"key:{self.name}"

    @property
    def limited(self) -> bool:
        return self.rate is not None or self.queue_share is not None

    def queue_limit(self, max_queue: int) -> int | None:
        """The most unfinished requests this key may have queued, or None."""
        return None if self.queue_share is None else max(1, math.floor(self.queue_share * max_queue))


ANONYMOUS = KeyPolicy("anonymous", authenticated=False)  # every caller, when keys are off


class ApiKeys:
    """The accepted keys (empty = authentication off) and their policies."""

    def __init__(self, keys: list[str] | tuple[str, ...] = (), policies: Mapping[str, KeyPolicy] | None = None):
        self._keys, self._policies = tuple(keys), dict(policies or {})
        entries = []
        for key in keys:
            if key:
                digest = hashlib.sha256(key.encode()).digest()
                entries.append((digest, (policies or {}).get(key) or KeyPolicy(default_name(key))))
        self._entries = tuple(entries)
        names = [p.name for _, p in entries]
        clash = {n for n in names if names.count(n) > 1}
        if clash:
            raise ConfigError(f"api_keys_file: the name {sorted(clash)[0]!r} is given to more than one key")

    @classmethod
    def from_text(cls, text: str) -> "ApiKeys":
        """The keys of ILRE_API_KEYS's text: comma-separated, blanks ignored."""
        return cls([k.strip() for k in text.split(",") if k.strip()])

    def with_file(self, path: str | None) -> "ApiKeys":
        """These keys plus those of the keys file `path` (None: these alone); ConfigError naming the line."""
        if not path:
            return self
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ConfigError(f"api_keys_file: cannot read {path}: {exc.strerror}") from None
        keys, policies = list(self._keys), dict(self._policies)
        for number, line in enumerate(lines, 1):
            words = line.split("#", 1)[0].split() if not line.lstrip().startswith("#") else []
            if words:
                keys.append(words[0])
                policies[words[0]] = parse_policy(words[0], words[1:], f"{path}:{number}")
        return ApiKeys(keys, policies)

    @classmethod
    def load(cls, environ: Mapping[str, str], path: str | None = None) -> "ApiKeys":
        """Keys from ILRE_API_KEYS plus the file `path` (or ILRE_API_KEYS_FILE)."""
        return cls.from_text(environ.get("ILRE_API_KEYS", "")).with_file(path or environ.get("ILRE_API_KEYS_FILE"))

    @property
    def enabled(self) -> bool:
        return bool(self._entries)

    @property
    def policies(self) -> list[KeyPolicy]:
        return [policy for _, policy in self._entries]

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"ApiKeys({len(self)} keys)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ApiKeys) and set(self._entries) == set(other._entries)

    def __hash__(self) -> int:
        return hash(frozenset(self._entries))

    def identify(self, authorization: str | None) -> KeyPolicy | None:
        """The policy of the key in 'Bearer <key>' (ANONYMOUS when auth is off); None = not accepted."""
        if not self._entries:
            return ANONYMOUS
        scheme, _, key = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return None
        presented = hashlib.sha256(key.strip().encode()).digest()
        found = None
        for digest, policy in self._entries:  # no early exit: the time does not depend on which key matched
            if hmac.compare_digest(presented, digest):
                found = policy
        return found

    def check(self, authorization: str | None) -> bool:
        """True if auth is off, or `authorization` is 'Bearer <an accepted key>'."""
        return self.identify(authorization) is not None


def default_name(key: str) -> str:
    """A key's name when the keys file gives none: key- and the first 8 hex digits of its SHA-256."""
    return f"key-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def parse_policy(key: str, words: list[str], where: str) -> KeyPolicy:
    """A key line's settings (`name=... rate=...`); ConfigError naming the line and the setting."""
    values: dict[str, str] = {}
    for word in words:
        name, sep, value = word.partition("=")
        if not sep or name not in SETTINGS or not value:
            raise ConfigError(f"api_keys_file: {where}: expected name=, rate=, burst=, queue_share= or share= after "
                              f"the key (got {word!r})")
        values[name] = value
    rate = _number(values, "rate", where, lambda v: v > 0, "> 0")
    burst = _number(values, "burst", where, lambda v: v >= 1 and v == int(v), "an integer >= 1")
    share = _number(values, "queue_share", where, lambda v: 0 < v <= 1, "in (0, 1]")
    if burst is not None and rate is None:
        raise ConfigError(f"api_keys_file: {where}: burst needs a rate")
    return KeyPolicy(values.get("name") or default_name(key), rate,
                     None if rate is None else int(burst or max(1, math.ceil(rate))), share, values.get("share"))


def _number(values: dict[str, str], name: str, where: str, ok, limit: str) -> float | None:
    if name not in values:
        return None
    try:
        value = float(values[name])
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or not ok(value):
        raise ConfigError(f"api_keys_file: {where}: {name} must be {limit} (got {values[name]!r})")
    return value
