"""Every declared setting of every server command reaches the process as its declared type, by flag and by
environment, and a value out of its bounds is refused naming it: `ilre serve|sidecar|worker --print-settings`
run through the real command line (`ilre.cli.main.main`, and one real process per command). The cases are
made from the declarations, so a new setting is tested as it lands; one whose values cannot be made from its
declaration (a free-form string) fails `test_every_setting_has_a_value_to_try` until EXAMPLES gives one."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from ilre.cli.main import main
from ilre.cli.parser import COMMAND_SETTINGS
from ilre.contract.settings import SERVERS, Setting, declared, settings_for
from tests.service.conftest import ILRE

SECRET = "set"
# settings whose values cannot be made from the declaration: (text, the value printed, other settings it needs)
EXAMPLES: dict[str, tuple[str, object, dict[str, str]]] = {
    "host": ("0.0.0.0", "0.0.0.0", {}),
    "redis_url": ("redis://127.0.0.1:6390/2", "redis://127.0.0.1:6390/2", {}),
    "redis_prefix": ("team-a", "team-a", {}),
    "api_keys": ("sk-a, sk-b", SECRET, {}),
    "api_keys_file": ("{keys_file}", "{keys_file}", {}),
    "document_secret": ("s" * 32, SECRET, {}),
    "tls_cert": ("cert.pem", "cert.pem", {"tls_key": "key.pem"}),
    "tls_key": ("key.pem", "key.pem", {"tls_cert": "cert.pem"}),
    "tls_client_ca": ("ca.pem", "ca.pem", {"tls_cert": "cert.pem", "tls_key": "key.pem"}),
    "worker_name": ("worker-7", "worker-7", {}),
    "model": ("/models/Qwen2.5-7B-Instruct", "/models/Qwen2.5-7B-Instruct", {}),
    "layer": ("fast", "fast", {}),
    "strategy": ("snapkv", "snapkv", {}),
    "strategy_options": ('{"lag": 256}', '{"lag": 256}', {}),
    "device": ("cpu", "cpu", {}),
    "dtype": ("float32", "float32", {}),
    "engine_url": ("http://engine:8000", "http://engine:8000", {}),
}
WORKER_NEEDS = {"redis_url": "redis://127.0.0.1:6379/0"}  # a worker refuses to start without it


def server_settings() -> list[tuple[str, Setting]]:
    return [(command, s) for command in SERVERS for s in settings_for(command, *COMMAND_SETTINGS[command])]


def numeric_value(setting: Setting, command: str) -> object:
    """A value of a numeric setting's type inside its bounds, other than its default."""
    kind = setting.parse if setting.parse in (int, float) else type(setting.default_of(command))
    low = setting.minimum if setting.minimum is not None else (setting.above + 1 if setting.above is not None else 1)
    for candidate in (low + 1, low, setting.maximum):
        value = kind(candidate) if candidate is not None else None
        if value is not None and value != setting.default_of(command) and setting.problem(value) is None:
            return value
    raise AssertionError(f"{setting.name}: no value in bounds found")


def example(setting: Setting, command: str) -> tuple[str, object, dict[str, str]] | None:
    """(text, expected value, companions) of a setting, None when nothing can be made for it."""
    if setting.name in EXAMPLES:
        return EXAMPLES[setting.name]
    if setting.choices:
        value = next(c for c in setting.choices if c != setting.default_of(command))
        return value, value, {}
    if setting.parse in (int, float) or isinstance(setting.default_of(command), (int, float)):
        value = numeric_value(setting, command)
        return str(value), value, {}
    return None


def outside(setting: Setting) -> str | None:
    """A text whose value is outside the setting's bounds (None: it has none)."""
    if setting.choices:
        return "no-such-choice"
    step = 1 if setting.parse is int else 0.5
    if setting.minimum is not None:
        return str(setting.minimum - step).removesuffix(".0") if setting.parse is int else str(setting.minimum - step)
    if setting.above is not None:
        return str(setting.above)
    if setting.maximum is not None:
        return str(setting.maximum + step)
    return None


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No declared ILRE_* variable set, and a keys file for `api_keys_file`."""
    for name in [n for n in os.environ if n.startswith("ILRE_")]:
        monkeypatch.delenv(name)
    keys = tmp_path / "keys"
    keys.write_text("sk-file name=team-a rate=2\n")
    return str(keys)


def run(capsys, argv: list[str]) -> tuple[int, str, str]:
    """main(argv)'s exit code (argparse's usage errors included), stdout and stderr."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def resolve(text: str, keys_file: str) -> str:
    return text.replace("{keys_file}", keys_file)


def given(command: str, how: str, values: dict[str, str], monkeypatch) -> list[str]:
    """argv giving `values` ({setting name: text}) by flag ("flag") or environment ("environment")."""
    argv = [command, "--print-settings"]
    for name, text in values.items():
        setting = next(s for s in declared_of(command) if s.name == name)
        if how == "flag" and setting.flag_of(command):
            argv += [setting.flag_of(command), text]
        else:
            monkeypatch.setenv(setting.env, text)
    return argv


def declared_of(command: str) -> list[Setting]:
    return settings_for(command, *COMMAND_SETTINGS[command])


def test_every_setting_has_a_value_to_try():
    missing = sorted({s.name for command, s in server_settings() if example(s, command) is None})
    assert not missing, f"add an example value to EXAMPLES for: {', '.join(missing)}"
    every = {s.name for classes in COMMAND_SETTINGS.values() for cls in classes for s in declared(cls)}
    assert every == {s.name for _, s in server_settings()}, "a setting no server command has is not tested here"


CASES = [(command, s, how) for command, s in server_settings() for how in ("flag", "environment")
         if how == "environment" or s.flag_of(command)]


@pytest.mark.parametrize(("command", "setting", "how"), CASES,
                         ids=[f"{c}-{s.name}-{how}" for c, s, how in CASES])
def test_a_setting_reaches_the_command_as_its_type(command, setting, how, clean_env, monkeypatch, capsys):
    text, expected, companions = example(setting, command)
    text, expected = resolve(text, clean_env), resolve(expected, clean_env) if isinstance(expected, str) else expected
    needs = {**(WORKER_NEEDS if command == "worker" and setting.name != "redis_url" else {}), **companions}
    for name, value in needs.items():
        monkeypatch.setenv(f"ILRE_{name.upper()}", value)
    code, out, err = run(capsys, given(command, how, {setting.name: text}, monkeypatch))
    assert code == 0, err
    printed = json.loads(out)["settings"][setting.name]
    assert printed["source"] == how
    assert printed["value"] == expected and type(printed["value"]) is type(expected), printed
    assert printed["env"] == setting.env and printed["flag"] == setting.flag_of(command)


BOUNDED = [(command, s, how) for command, s, how in CASES if outside(s) is not None]


@pytest.mark.parametrize(("command", "setting", "how"), BOUNDED,
                         ids=[f"{c}-{s.name}-{how}" for c, s, how in BOUNDED])
def test_a_value_outside_its_bounds_is_refused_naming_it(command, setting, how, clean_env, monkeypatch, capsys):
    if command == "worker":
        monkeypatch.setenv("ILRE_REDIS_URL", WORKER_NEEDS["redis_url"])
    code, _, err = run(capsys, given(command, how, {setting.name: outside(setting)}, monkeypatch))
    assert code == 2, err
    named = setting.env if how == "environment" else setting.name
    assert named in err or (how == "flag" and setting.flag_of(command) in err), err
    assert "Traceback" not in err


def test_defaults_print_as_defaults_and_secrets_never_show(clean_env, monkeypatch, capsys):
    monkeypatch.setenv("ILRE_API_KEYS", "sk-very-secret")
    monkeypatch.setenv("ILRE_DOCUMENT_SECRET", "d" * 40)
    code, out, err = run(capsys, ["serve", "--print-settings", "--max-batch", "4"])
    assert code == 0, err
    settings = json.loads(out)["settings"]
    assert "sk-very-secret" not in out and "d" * 40 not in out
    assert settings["api_keys"] == {"value": "set", "source": "environment", "flag": None, "env": "ILRE_API_KEYS"}
    assert settings["max_batch"]["value"] == 4 and settings["max_batch"]["source"] == "flag"
    assert settings["deepen"] == {"value": "idle", "source": "default", "flag": "--deepen", "env": "ILRE_DEEPEN"}
    assert settings["grpc_port"]["value"] == 50051 and settings["grpc_port"]["source"] == "default"


def test_a_flag_beats_the_environment(clean_env, monkeypatch, capsys):
    monkeypatch.setenv("ILRE_MAX_QUEUE", "9")
    code, out, _ = run(capsys, ["sidecar", "--print-settings", "--max-queue", "12"])
    assert code == 0 and json.loads(out)["settings"]["max_queue"] == {"value": 12, "source": "flag", "flag": "--max-queue",
                                                                       "env": "ILRE_MAX_QUEUE"}


@pytest.mark.parametrize("command", SERVERS)
def test_print_settings_as_a_process(command, tmp_path):
    """The installed command: settings by flag and environment printed, exit 0, no model loaded (its cache
    folder stays empty); a bad value exits 2 with one line naming it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ILRE_")}
    env.update(ILRE_CACHE_DIR=str(tmp_path / "cache"), ILRE_MAX_BATCH="3", ILRE_REDIS_URL="redis://127.0.0.1:6379/0")
    proc = subprocess.run([*ILRE, command, "--print-settings", "--doc-cache-mb", "32"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    settings = json.loads(proc.stdout)["settings"]
    assert settings["max_batch"]["value"] == 3 and settings["max_batch"]["source"] == "environment"
    assert settings["doc_cache_mb"]["value"] == 32 and settings["doc_cache_mb"]["source"] == "flag"
    assert not (tmp_path / "cache" / "models").exists()  # no model loaded; the C kernels built, and said which run
    from ilre.kernels.native_build import compiler

    kernels = json.loads(proc.stdout)["kernels"]
    assert set(kernels) == {"chunk_attention", "layer_passes"}
    assert compiler() is None or "not built" not in " ".join(kernels.values()), kernels
    bad = subprocess.run([*ILRE, command, "--print-settings"], capture_output=True, text=True, timeout=120,
                         env={**env, "ILRE_MAX_BATCH": "0"})
    assert bad.returncode == 2 and bad.stderr.strip() == "error: max_batch: must be >= 1 (got 0; env ILRE_MAX_BATCH)"
