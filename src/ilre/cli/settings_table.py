"""README's settings tables, made from the declared settings (cli/parser.py's COMMAND_SETTINGS): one row per
setting with its flag, environment variable, default, commands and help. `make settings` rewrites the
tables between their markers; tests/cli/test_settings_table.py fails while a page and the declarations differ.

    python -m ilre.cli.settings_table README.md docs/operations.md
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..contract.settings import MODEL_COMMANDS, SERVERS, Setting, settings_for
from .parser import COMMAND_SETTINGS

# read by the processes but no command's setting: where files live, and what helps a diagnosis
OTHER_ENVIRONMENT = (
    ("ILRE_CACHE_DIR", "where the embedded model's converted copy is kept (default ~/.cache/ilre)"),
    ("ILRE_LOCRET_DIR", "another folder searched for Locret's retaining heads"),
    ("ILRE_API_KEY", "the API key `ilre compress --server` sends (its --api-key wins)"),
    ("ILRE_DEBUG", "1: print the traceback of an internal error"),
    ("ILRE_NATIVE_PASSES", "0: a layer's norms, SiLU and RoPE run PyTorch's operators, not the C passes (benches)"),
)
BEGIN = "<!-- settings: {kind} (made by `make settings` from the declared settings; do not edit) -->"
END = "<!-- end of settings: {kind} -->"


def _rows() -> list[tuple[Setting, list[str]]]:
    """Every declared setting once, with the commands it belongs to, in the order of COMMAND_SETTINGS."""
    found: dict[tuple[type, str], tuple[Setting, list[str]]] = {}
    for command, classes in COMMAND_SETTINGS.items():
        for cls in classes:
            for setting in settings_for(command, cls):
                found.setdefault((cls, setting.name), (setting, []))[1].append(command)
    return list(found.values())


def _commands(commands: list[str]) -> str:
    if set(commands) == set(MODEL_COMMANDS):
        return "all"
    if set(commands) == set(SERVERS):
        return "servers"
    return ", ".join(commands)


def _default(setting: Setting, commands: list[str]) -> str:
    if setting.secret:
        return "-"
    shown: dict[str, list[str]] = {}
    for command in commands:
        shown.setdefault(setting.described_default(command), []).append(command)
    if len(shown) == 1:
        return next(iter(shown))
    return "; ".join(f"{value} ({', '.join(where)})" for value, where in shown.items())


def _flags(setting: Setting, commands: list[str]) -> str:
    flags = sorted({f for f in (setting.flag_of(c) for c in commands) if f}, key=len, reverse=True)
    return " / ".join(f"`{f}`" for f in flags) or "(environment only)"


def settings_table(kind: str) -> str:
    """The markdown table of `kind`: "common" (what an operator sets), "advanced" (rarely touched) or
    "environment" (names read outside the commands' settings)."""
    if kind == "environment":
        lines = ["| Environment | Meaning |", "|---|---|"]
        lines += [f"| `{name}` | {meaning} |" for name, meaning in OTHER_ENVIRONMENT]
        return "\n".join(lines)
    lines = ["| Flag | Environment | Default | Commands | Meaning |", "|---|---|---|---|---|"]
    for setting, commands in _rows():
        if setting.advanced == (kind == "advanced"):
            cells = (_flags(setting, commands), f"`{setting.env}`", _default(setting, commands), _commands(commands),
                     setting.help.replace("|", "\\|"))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rewrite(text: str) -> str:
    """`text` with every settings table between its markers made afresh."""
    for kind in ("common", "advanced", "environment"):
        begin, end = BEGIN.format(kind=kind), END.format(kind=kind)
        if begin in text:
            head, rest = text.split(begin, 1)
            _, tail = rest.split(end, 1)
            text = f"{head}{begin}\n{settings_table(kind)}\n{end}{tail}"
    return text


def main(paths: list[str]) -> int:
    for name in paths:
        path = Path(name)
        path.write_text(rewrite(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
