"""The settings are declared once: README's tables, every server command's flags and the environment names
the code reads all come from the declarations (contract/settings.py), and this fails while any differs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ilre.cli.parser import COMMAND_SETTINGS, build_parser
from ilre.cli.settings_table import BEGIN, OTHER_ENVIRONMENT, rewrite, settings_table
from ilre.contract.settings import declared, settings_for

ROOT = Path(__file__).resolve().parents[2]
PAGES = {"common": ROOT / "README.md", "environment": ROOT / "README.md", "advanced": ROOT / "docs" / "operations.md"}
# names read by parts that are no command's settings: the LiteLLM hook's own, the evaluation's LLMLingua
OUTSIDE = re.compile(r"ILRE_(LITELLM\w*|LINGUA_PYTHON)$")


@pytest.mark.parametrize("kind", sorted(PAGES))
def test_each_page_holds_its_table_as_declared(kind):
    text = PAGES[kind].read_text()
    assert BEGIN.format(kind=kind) in text, f"{PAGES[kind]} lost its {kind} settings table"
    assert rewrite(text) == text, f"{PAGES[kind].name}'s settings tables differ from the declarations: make settings"
    assert settings_table(kind) in text


def _subcommand(command: str):
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    return sub.choices[command]


@pytest.mark.parametrize("command", sorted(COMMAND_SETTINGS))
def test_every_flag_is_a_declared_setting(command):
    options = {o for a in _subcommand(command)._actions for o in a.option_strings} - {"-h", "--help"}
    declared_flags = {s.flag_of(command) for s in settings_for(command, *COMMAND_SETTINGS[command])} - {None}
    assert declared_flags <= options
    if command in ("serve", "sidecar", "worker"):  # a server's flags are its settings, and --print-settings
        assert options == declared_flags | {"--print-settings"}
    help_text = _subcommand(command).format_help()
    for setting in settings_for(command, *COMMAND_SETTINGS[command]):
        if setting.flag_of(command):
            assert setting.env in help_text.replace("\n", " ").replace("  ", ""), setting.name


def test_every_environment_name_the_code_reads_is_declared():
    declared_names = {s.env for classes in COMMAND_SETTINGS.values() for cls in classes for s in declared(cls)}
    documented = declared_names | {name for name, _ in OTHER_ENVIRONMENT}
    read = {m for path in (ROOT / "src" / "ilre").rglob("*.py")
            for m in re.findall(r"ILRE_[A-Z0-9_]*[A-Z0-9]", path.read_text())}
    assert read - documented - {n for n in read if OUTSIDE.match(n)} == set()


def test_a_flag_wins_over_its_variable_which_wins_over_the_default(monkeypatch):
    monkeypatch.setenv("ILRE_MAX_QUEUE", "17")
    monkeypatch.setenv("ILRE_SINK", "8")
    monkeypatch.delenv("ILRE_DEEPEN", raising=False)
    args = build_parser().parse_args(["serve", "--sink", "2"])
    assert (args.max_queue, args.sink, args.max_batch, args.deepen) == (17, 2, 8, "idle")
    assert build_parser().parse_args(["sidecar"]).deepen == "idle"


@pytest.mark.parametrize("words, message", [
    (["serve", "--max-queue", "0"], "error: max_queue: must be >= 1 (got 0)"),
    (["sidecar", "--port", "70000"], "error: http_port: must be a port in 0..65535 (got 70000)"),
    (["compress", "--context", "x", "--chunk", "0"], "error: chunk: must be >= 1 (got 0)"),
])
def test_a_value_out_of_bounds_is_one_line_naming_the_setting(words, message, capsys):
    from ilre.cli.main import main

    assert main(words) == 2
    assert capsys.readouterr().err.strip() == message


@pytest.mark.parametrize("words, message", [
    (["worker", "--heartbeat", "soon"], "argument --heartbeat: must be a number (got 'soon')"),
    (["serve", "--log-format", "xml"], "argument --log-format: must be one of text, json (got 'xml')"),
])
def test_a_flag_that_is_no_value_is_a_usage_error(words, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(words)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_a_bad_variable_names_itself(monkeypatch, capsys):
    from ilre.cli.main import main

    monkeypatch.setenv("ILRE_DOC_CACHE_MB", "-1")
    assert main(["serve"]) == 2
    assert capsys.readouterr().err.strip() == "error: doc_cache_mb: must be >= 0 (got -1; env ILRE_DOC_CACHE_MB)"
    monkeypatch.setenv("ILRE_DOC_CACHE_MB", "lots")
    assert main(["serve"]) == 2
    assert capsys.readouterr().err.strip() == "error: ILRE_DOC_CACHE_MB: must be an integer (got 'lots')"
