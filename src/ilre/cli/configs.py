"""The typed configs of a command, made in one place from its resolved settings (cli/parser.py resolves each
declared setting from its flag, its `ILRE_<NAME>` variable or its default, parsed by the setting's own
`parse`): what `serve`, `sidecar` and `worker` start with, and what `--print-settings` prints.

    ilre serve --print-settings     # {"command": "serve", "settings": {"grpc_port": {"value": 50051,
                                    #   "source": "default", "flag": "--grpc-port", "env": "ILRE_GRPC_PORT"}, ...}}
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any

from ..contract.settings import Setting, settings_for
from ..engine.engine_settings import EngineSettings
from ..service.common.config import ServiceConfig, SidecarConfig
from .output import CliError
from .parser import COMMAND_SETTINGS


@dataclass(frozen=True)
class CommandConfigs:
    """A server command's configs: the engine's settings, the service's and (sidecar) the engine behind it."""

    command: str
    engine: EngineSettings
    service: ServiceConfig
    sidecar: SidecarConfig | None = None

    def value_of(self, setting: Setting) -> Any:
        """The effective value of a declared setting of this command, as its config holds it."""
        for config in (self.sidecar, self.service, self.engine):
            if config is not None and setting.name in type(config).__dataclass_fields__:
                return getattr(config, setting.name)
        raise KeyError(setting.name)


def declared_values(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The resolved values (cli/parser.py) of the command's settings declared by `cls`."""
    return {s.name: getattr(args, s.name) for s in settings_for(args.command, cls)}


def engine_settings(args: argparse.Namespace) -> EngineSettings:
    """The command's EngineSettings; CliError naming a bad setting."""
    from ..engine.engine_config import EngineConfig

    try:
        settings = EngineSettings(**declared_values(args, EngineSettings))
        EngineConfig.from_settings(settings)  # the prefill's own checks (sink, window, chunk)
        return settings
    except ValueError as exc:
        raise CliError(str(exc).strip("'\"")) from None


def command_configs(args: argparse.Namespace) -> CommandConfigs:
    """Every config of a server command (serve, sidecar, worker), checked as starting checks them: the device
    and dtype resolved, the service's and the sidecar's bounds and pairs; CliError naming the setting.
    Loads no model."""
    from ..models.device import resolve_placement

    engine = engine_settings(args)
    try:
        resolve_placement(engine.device, engine.dtype)
        service = ServiceConfig.from_env(os.environ, **declared_values(args, ServiceConfig),
                                         max_context_tokens=engine.max_context_tokens)
        sidecar = (SidecarConfig.from_env(os.environ, **declared_values(args, SidecarConfig))
                   if args.command == "sidecar" else None)
    except ValueError as exc:  # ConfigError, PlacementError
        raise CliError(str(exc)) from None
    if args.command == "worker" and not service.redis_url:
        raise CliError("redis-url: a worker needs --redis-url (or ILRE_REDIS_URL)")
    return CommandConfigs(args.command, engine, service, sidecar)


def printed_settings(args: argparse.Namespace, configs: CommandConfigs) -> dict[str, Any]:
    """`--print-settings`'s JSON: every declared setting of the command with its effective value, where it
    came from (flag, environment, default), its flag and its variable; a secret's value is "set" or "unset"."""
    sources: dict[str, str] = getattr(args, "setting_sources", {})
    settings: dict[str, Any] = {}
    for setting in settings_for(args.command, *COMMAND_SETTINGS[args.command]):
        source = sources.get(setting.name, "default")
        value = configs.value_of(setting)
        if setting.secret:
            value = "unset" if source == "default" else "set"
        settings[setting.name] = {"value": value, "source": source, "flag": setting.flag_of(args.command),
                                  "env": setting.env}
    return {"command": args.command, "settings": settings}
