"""Selection strategies by name: one module each, all behind `Strategy`. A scorer of one's own is one file: a
frozen dataclass subclass of `Strategy` with a `name` and `score`, made known by `register_strategy`."""

from __future__ import annotations

from ...contract.defaults import DEFAULT_STRATEGY
from ...contract.messages import CompressRequest, InputError
from .actqkv import ActQKV
from .base import ScoreInputs, Strategy, option_names
from .cascade import Cascade
from .ilre import ILRe
from .lagkv import LagKV
from .locret import Locret
from .reattention import ReAttention
from .snapkv import SnapKV
from .streaming_llm import StreamingLLM

STRATEGIES: dict[str, type[Strategy]] = {cls.name: cls for cls in (Cascade, ILRe, SnapKV, StreamingLLM, LagKV, ReAttention,
                                                             Locret, ActQKV)}
assert DEFAULT_STRATEGY in STRATEGIES


def register_strategy(cls: type[Strategy]) -> type[Strategy]:
    """Make `cls` known by its `name` to requests, the service and the CLI (a class decorator, for a scorer defined
    outside this package); ValueError naming the strategy when another class holds the name."""
    name = cls.__dict__.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"strategy: {cls.__name__} needs a `name` of its own")
    if STRATEGIES.get(name, cls) is not cls:
        raise ValueError(f"strategy: the name {name!r} is taken by {STRATEGIES[name].__name__}")
    STRATEGIES[name] = cls
    return cls


def make_strategy(name: str, options: dict | None = None) -> Strategy:
    """Build a strategy from its name and options; ValueError naming the field on bad input."""
    cls = STRATEGIES.get(name)
    if cls is None:
        raise ValueError(f"strategy: unknown strategy {name!r} (known: {', '.join(sorted(STRATEGIES))})")
    allowed = option_names(cls)
    unknown = set(options or {}) - allowed
    if unknown:
        raise ValueError(
            f"strategy_options.{min(unknown)}: {name} does not take {', '.join(sorted(unknown))}"
            f" (options: {', '.join(sorted(allowed)) or 'none'})"
        )
    return cls(**(options or {}))


def requested_strategy(request: CompressRequest) -> Strategy:
    """The strategy `request` names, built with its options; InputError naming the field when the name or an option
    is bad, or when the request carries no query and the strategy scores by one."""
    try:
        strategy = make_strategy(request.strategy, request.strategy_options)
    except (TypeError, ValueError) as exc:
        raise InputError.from_option_error(exc) from None
    if strategy.needs_query:
        request.require_query()
    return strategy


__all__ = ["DEFAULT_STRATEGY", "STRATEGIES", "ScoreInputs", "Strategy", "make_strategy", "register_strategy",
           "requested_strategy"]
