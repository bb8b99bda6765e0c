"""Optional API keys: `authorization: Bearer <key>` (gRPC metadata or HTTP header).

Keys come from ILRE_API_KEYS (comma-separated) and/or a file (one key per line, `#` comments;
ILRE_API_KEYS_FILE or --api-keys-file). Only SHA-256 digests are kept; a presented key is hashed
and compared with every digest in constant time. Keys are never logged or printed.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Mapping

from .errors import ConfigError

UNAUTHENTICATED_MESSAGE = "authorization: missing or invalid API key (send 'authorization: Bearer <key>')"


class ApiKeys:
    """A set of accepted keys (empty = authentication off)."""

    def __init__(self, keys: list[str] | tuple[str, ...] = ()):
        self._digests = tuple(hashlib.sha256(k.encode()).digest() for k in keys if k)

    @classmethod
    def load(cls, environ: Mapping[str, str], path: str | None = None) -> "ApiKeys":
        """Keys from ILRE_API_KEYS plus the file `path` (or ILRE_API_KEYS_FILE)."""
        keys = [k.strip() for k in environ.get("ILRE_API_KEYS", "").split(",") if k.strip()]
        path = path or environ.get("ILRE_API_KEYS_FILE") or None
        if path:
            try:
                lines = Path(path).read_text(encoding="utf-8").splitlines()
            except OSError as exc:
                raise ConfigError(f"api_keys_file: cannot read {path}: {exc.strerror}") from None
            keys += [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
        return cls(keys)

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def __len__(self) -> int:
        return len(self._digests)

    def __repr__(self) -> str:
        return f"ApiKeys({len(self)} keys)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ApiKeys) and set(self._digests) == set(other._digests)

    def __hash__(self) -> int:
        return hash(frozenset(self._digests))

    def check(self, authorization: str | None) -> bool:
        """True if auth is off, or `authorization` is 'Bearer <an accepted key>'."""
        if not self._digests:
            return True
        scheme, _, key = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return False
        presented = hashlib.sha256(key.strip().encode()).digest()
        ok = False
        for digest in self._digests:  # no early exit: the time does not depend on which key matched
            ok |= hmac.compare_digest(presented, digest)
        return ok
