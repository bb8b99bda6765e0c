"""Per-request compression options of the sidecar: server defaults < `x-ilre-*` headers < the
request body's `compression` object (removed before the request is forwarded).

    "compression": {"enabled": true, "budget": 1024 | "ratio": 0.1, "strategy": "cascade",
                    "strategy_options": {...}, "query_tokens": 64, "granularity": "token" | "unit",
                    "history": "fresh" | "frozen", "retrieve_rounds": 0..8}
    x-ilre-compress: on|off   x-ilre-budget: N   x-ilre-ratio: R   x-ilre-strategy: NAME   x-ilre-query-tokens: N
    x-ilre-granularity: token|unit   x-ilre-history: fresh|frozen   x-ilre-retrieve-rounds: N
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from ...contract.defaults import MAX_QUERY_TOKENS, QUERY_TOKENS
from ...contract.messages import GRANULARITIES, InputError
from ..common.config import HISTORY_MODES, MAX_RETRIEVE_ROUNDS

BODY_FIELD = "compression"
HEADER_PREFIX = "x-ilre-"


@dataclass(frozen=True)
class CompressionOptions:
    """What to do with one request. budget/ratio None = the engine's default budget."""

    enabled: bool = True
    budget: int | None = None
    ratio: float | None = None
    strategy: str | None = None
    strategy_options: dict[str, Any] = field(default_factory=dict)
    query_tokens: int = QUERY_TOKENS  # plain prompts: the last N tokens are the query (ILRe's LongBench rule)
    granularity: str | None = None  # token | unit (whole sentences, lines, records); None = the server's default
    history: str = "fresh"  # conversations: fresh (each message for the live question) | frozen (sidecar/history.py)
    retrieve_rounds: int = 0  # conversations: rounds of ilre_retrieve calls answered by the sidecar (sidecar/retrieve.py)

    def request_fields(self) -> dict[str, Any]:
        """The CompressRequest fields these options set."""
        fields = {"budget": self.budget, "ratio": self.ratio, "strategy": self.strategy,
                  "strategy_options": self.strategy_options or None, "granularity": self.granularity}
        return {k: v for k, v in fields.items() if v is not None}

    def resolve(self, headers: Mapping[str, str], body_options: Any) -> "CompressionOptions":
        """These defaults overridden by the request's headers, then by its `compression` object."""
        changes = _one_size(_from_headers(headers))
        if body_options is not None:
            if not isinstance(body_options, dict):
                raise InputError(BODY_FIELD, "must be an object of compression options")
            known = {f.name for f in dataclasses.fields(CompressionOptions)}
            unknown = sorted(set(body_options) - known)
            if unknown:
                raise InputError(f"{BODY_FIELD}.{unknown[0]}", f"unknown option (known: {', '.join(sorted(known))})")
            body = _one_size({name: (f"{BODY_FIELD}.{name}", v) for name, v in body_options.items() if v is not None})
            if "budget" in body or "ratio" in body:  # the body's size replaces the headers'
                changes.pop("budget", None)
                changes.pop("ratio", None)
            changes.update(body)
        values = {name: _check(name, where, value) for name, (where, value) in changes.items()}
        if "budget" in values:
            values.setdefault("ratio", None)
        if "ratio" in values:
            values.setdefault("budget", None)
        return dataclasses.replace(self, **values)


def _one_size(changes: dict[str, tuple[str, Any]]) -> dict[str, tuple[str, Any]]:
    """`changes` unless they give both a budget and a ratio (one level may not give both)."""
    if "budget" in changes and "ratio" in changes:
        raise InputError(changes["budget"][0], "give either budget or ratio, not both")
    return changes


def _from_headers(headers: Mapping[str, str]) -> dict[str, tuple[str, Any]]:
    names = {"compress": "enabled", "budget": "budget", "ratio": "ratio", "strategy": "strategy",
             "query-tokens": "query_tokens", "granularity": "granularity", "history": "history",
             "retrieve-rounds": "retrieve_rounds"}
    changes: dict[str, tuple[str, Any]] = {}
    for suffix, name in names.items():
        raw = headers.get(HEADER_PREFIX + suffix)
        if raw is None:
            continue
        where = HEADER_PREFIX + suffix
        if name == "enabled":
            flags = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}
            if raw.strip().lower() not in flags:
                raise InputError(where, f"must be on or off (got {raw!r})")
            changes[name] = (where, flags[raw.strip().lower()])
        elif name in ("budget", "query_tokens", "retrieve_rounds"):
            try:
                changes[name] = (where, int(raw))
            except ValueError:
                raise InputError(where, f"must be a positive integer (got {raw!r})") from None
        elif name == "ratio":
            try:
                changes[name] = (where, float(raw))
            except ValueError:
                raise InputError(where, f"must be a number in (0, 1] (got {raw!r})") from None
        else:
            changes[name] = (where, raw.strip())
    return changes


def _check(name: str, where: str, value: Any) -> Any:
    """`value` if valid for option `name`, else InputError naming `where` and the limit."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if name == "enabled" and not isinstance(value, bool):
        raise InputError(where, f"must be true or false (got {value!r})")
    if name == "budget" and (not is_int or value < 1):
        raise InputError(where, f"must be a positive integer (got {value!r})")
    if name == "ratio" and (isinstance(value, bool) or not isinstance(value, (int, float))
                            or not math.isfinite(value) or not 0 < value <= 1):
        raise InputError(where, f"must be a number in (0, 1] (got {value!r})")
    if name == "strategy" and (not isinstance(value, str) or not value):
        raise InputError(where, f"must be a strategy name (got {value!r})")
    if name == "strategy_options" and not isinstance(value, dict):
        raise InputError(where, "must be an object of option names to values")
    if name == "query_tokens" and (not is_int or not 1 <= value <= MAX_QUERY_TOKENS):
        raise InputError(where, f"must be an integer in 1..{MAX_QUERY_TOKENS} (got {value!r})")
    if name == "granularity" and value not in GRANULARITIES:
        raise InputError(where, f"must be one of {', '.join(GRANULARITIES)} (got {value!r})")
    if name == "retrieve_rounds" and (not is_int or not 0 <= value <= MAX_RETRIEVE_ROUNDS):
        raise InputError(where, f"must be an integer in 0..{MAX_RETRIEVE_ROUNDS} (got {value!r})")
    if name == "history" and value not in HISTORY_MODES:
        raise InputError(where, f"must be one of {', '.join(HISTORY_MODES)} (got {value!r})")
    return value
