"""Declared settings: each setting of a process is one dataclass field carrying its type, default, bounds,
environment name, flag and one line of help (`setting(...)`). The CLI's flags, the environment reading,
the checks and README's settings table are all made from these declarations, so they cannot drift.

A value is taken from the flag when given, else from the environment (`ILRE_<NAME>`), else from the
command's default; every value is checked against its bounds wherever it came from.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

SERVERS = ("serve", "sidecar", "worker")  # the commands that run a server process
MODEL_COMMANDS = ("compress", "batch", "demo", *SERVERS)  # the commands that load the model


class SettingError(ValueError):
    """A setting that cannot be used; the message names the setting and the limit."""


@dataclass(frozen=True)
class Setting:
    """One declared setting; `name` is its field's name. `parse` turns the text of a flag or an environment
    variable into a value (int, float, str or a function raising ValueError)."""

    name: str
    default: Any
    help: str
    commands: tuple[str, ...]
    parse: Callable[[str], Any] = str
    minimum: float | None = None      # value >= minimum
    above: float | None = None        # value > above
    maximum: float | None = None      # value <= maximum
    choices: tuple[str, ...] = ()
    what: str = ""                    # a noun for the bounds' message: "a port"
    flag: str | None = ""             # "" = --<name> without a trailing _s; None = environment only
    flag_for: tuple[tuple[str, str], ...] = ()   # (command, flag) where a command names it otherwise
    default_for: tuple[tuple[str, Any], ...] = ()  # (command, default) where a command's default differs
    shown_default: str | None = None  # the default as the docs say it, when the value alone would mislead
    advanced: bool = False            # rarely touched: listed apart in --help and README
    secret: bool = False              # never shown (the default is not printed either)
    exclusive: str | None = None      # settings sharing this name are given one at a time
    metavar: str | None = None

    @property
    def env(self) -> str:
        return f"ILRE_{self.name.upper()}"

    def flag_of(self, command: str) -> str | None:
        """The flag naming this setting on `command` (None: set through the environment only)."""
        if self.flag is None:
            return None
        own = dict(self.flag_for).get(command)
        if own:
            return own
        return self.flag or "--" + self.name.removesuffix("_s").replace("_", "-")

    def default_of(self, command: str | None) -> Any:
        return dict(self.default_for).get(command, self.default) if command else self.default

    def described_default(self, command: str | None = None) -> str:
        if self.shown_default is not None:
            return self.shown_default
        value = self.default_of(command)
        return "none" if value is None else str(value)

    def from_text(self, raw: str) -> Any:
        """The value of `raw` (a flag's or an environment variable's text), checked; SettingError whose
        message names no source (the caller adds the flag or the variable)."""
        try:
            value = self.parse(raw)
        except ValueError as exc:
            kind = {int: "an integer", float: "a number"}.get(self.parse)
            raise SettingError(f"must be {kind} (got {raw!r})" if kind else str(exc)) from None
        return value

    def problem(self, value: Any, note: str = "") -> str | None:
        """What is wrong with `value` ("must be >= 1 (got 0)"), None when it is in bounds; `note` is added
        inside the parentheses (where the value came from)."""
        if value is None or isinstance(value, bool):
            return None
        got = f"(got {value!r}{note})"
        if self.choices and value not in self.choices:
            return f"must be one of {', '.join(self.choices)} {got}"
        if not isinstance(value, (int, float)):
            return None
        if self.minimum is not None and self.maximum is not None and not self.minimum <= value <= self.maximum:
            return f"must be {self.what + ' ' if self.what else ''}in {self.minimum}..{self.maximum} {got}"
        if self.minimum is not None and value < self.minimum:
            return f"must be >= {self.minimum} {got}"
        if self.above is not None and not value > self.above:
            return f"must be > {self.above} {got}"
        if self.maximum is not None and value > self.maximum:
            return f"must be <= {self.maximum} {got}"
        return None

    def check(self, value: Any, note: str = "") -> None:
        """SettingError naming the setting when `value` is out of bounds."""
        problem = self.problem(value, note)
        if problem:
            raise SettingError(f"{self.name}: {problem}")


def setting(default: Any = None, help: str = "", commands: Iterable[str] = MODEL_COMMANDS, *,
            default_factory: Callable[[], Any] | None = None, **declared: Any) -> Any:
    """A dataclass field declaring a setting (see `Setting` for the keywords); `parse` defaults to the
    default's type (str when the default is None)."""
    if "parse" not in declared and default is not None and type(default) in (int, float, str):
        declared["parse"] = type(default)
    meta = {"setting": {"default": default, "help": help, "commands": tuple(commands), **declared}}
    shown = not declared.get("secret", False)  # a secret is never in a repr
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta, repr=shown)
    return dataclasses.field(default=default, metadata=meta, repr=shown)


@functools.lru_cache(maxsize=None)
def declared(cls: type) -> tuple[Setting, ...]:
    """The settings declared by dataclass `cls`, in field order."""
    return tuple(Setting(name=f.name, **f.metadata["setting"]) for f in dataclasses.fields(cls) if "setting" in f.metadata)


def settings_for(command: str, *classes: type) -> list[Setting]:
    """The settings of `command` among the classes' declarations."""
    return [s for cls in classes for s in declared(cls) if command in s.commands]


def check_settings(instance: Any, error: type[ValueError] = SettingError) -> None:
    """Check every declared field of a dataclass instance against its bounds (`error` raised, naming it)."""
    for s in declared(type(instance)):
        try:
            s.check(getattr(instance, s.name))
        except SettingError as exc:
            raise error(str(exc)) from None


SOURCES = ("flag", "environment", "default")  # where a resolved value came from, first wins


def read_settings(settings: Iterable[Setting], environ: Mapping[str, str], given: Mapping[str, Any],
                  command: str | None = None, error: type[ValueError] = SettingError,
                  sources: dict[str, str] | None = None) -> dict[str, Any]:
    """{name: value} of `settings`: the given value (None = not given), else the environment's, else the
    command's default; each checked, an environment value's error naming its variable. `sources`, when
    given, receives {name: one of SOURCES}."""
    values: dict[str, Any] = {}
    try:
        for s in settings:
            value = given.get(s.name)
            raw = environ.get(s.env)
            if value is not None:
                s.check(value)
                source = "flag"
            elif raw not in (None, ""):
                try:
                    value = s.from_text(raw)
                except SettingError as exc:
                    raise SettingError(f"{s.env}: {exc}") from None
                s.check(value, f"; env {s.env}")
                source = "environment"
            else:
                value = s.default_of(command)
                source = "default"
            values[s.name] = value
            if sources is not None:
                sources[s.name] = source
    except SettingError as exc:
        raise error(str(exc)) from None
    return values


def from_settings(cls: type, environ: Mapping[str, str], overrides: dict[str, Any], command: str | None = None,
                  error: type[ValueError] = SettingError) -> dict[str, Any]:
    """Keyword arguments of dataclass `cls`: its declared settings read by `read_settings`, and the given
    values (None = not given) of its other fields; TypeError on an unknown name."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(overrides) - set(fields)
    if unknown:
        raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
    values = read_settings(declared(cls), environ, overrides, command, error)
    values = {k: v for k, v in values.items()  # a field made by its factory keeps it
              if not (v is None and fields[k].default_factory is not dataclasses.MISSING)}
    values.update({k: v for k, v in overrides.items() if k not in values and v is not None})
    return values
