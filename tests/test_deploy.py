"""deploy/ holds files no container engine runs here: each compose file is checked against the
Compose specification's schema, each Kubernetes manifest against the Kubernetes schemas, and each
`ilre ...` command line in them against the real argument parser."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ilre.cli.main import build_parser

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
COMPOSE = sorted(DEPLOY.rglob("docker-compose*.yml"))
MANIFESTS = sorted(p for p in DEPLOY.rglob("*.yaml"))
BIN = Path(sys.executable).parent


def test_there_is_something_to_check():
    assert len(COMPOSE) >= 2 and len(MANIFESTS) >= 4
    assert DEPLOY / "sidecar" / "docker-compose.yml" in COMPOSE and DEPLOY / "sidecar" / "pod.yaml" in MANIFESTS


@pytest.mark.parametrize("path", COMPOSE, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_compose_files_follow_the_compose_spec(path):
    run = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(path)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_kubernetes_manifests_validate(path):
    run = subprocess.run([str(BIN / "kubernetes-validate"), "--strict", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def ilre_commands(node) -> list[list[str]]:
    """Every list of strings in a YAML tree that starts with "ilre"."""
    found = []
    if isinstance(node, dict):
        for value in node.values():
            found += ilre_commands(value)
    elif isinstance(node, list):
        if node and node[0] == "ilre" and all(isinstance(x, str) for x in node):
            found.append(node)
        for value in node:
            found += ilre_commands(value)
    return found


# the ilre commands each file runs; a file missing here fails the test until it is listed
COMMANDS = {"docker-compose.yml": {"serve", "worker"}, "sidecar/docker-compose.yml": {"sidecar", "worker"},
            "k8s/frontend.yaml": {"serve"}, "k8s/worker.yaml": {"worker"}, "sidecar/pod.yaml": {"sidecar"}}


def test_redis_manifest_runs_redis_with_an_append_only_file():
    (redis,) = [d for d in yaml.safe_load_all((DEPLOY / "k8s" / "redis.yaml").read_text()) if d["kind"] == "StatefulSet"]
    (container,) = redis["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith("redis:") and container["args"] == ["--appendonly", "yes"]
    assert not ilre_commands(redis)


@pytest.mark.parametrize("path", [p for p in COMPOSE + MANIFESTS if p.name != "redis.yaml"],
                         ids=lambda p: str(p.relative_to(DEPLOY)))
def test_ilre_command_lines_parse(path):
    commands = [cmd for doc in yaml.safe_load_all(path.read_text()) for cmd in ilre_commands(doc)]
    assert {cmd[1] for cmd in commands} == COMMANDS[str(path.relative_to(DEPLOY))]
    for command in commands:
        words = [re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", word) for word in command[1:]]  # compose defaults
        build_parser().parse_args(words)  # SystemExit (a failure) on an unknown flag or a bad value


# every ILRE_* name deploy/ sets is a declared setting of the process it configures, and each process's values
# pass `ilre <command> --print-settings` (checked as starting checks them; no model loaded)
OPTIONAL = re.compile(r"^(\s*)#\s*(ILRE_[A-Z0-9_]+:[^#]*?)\s*(#.*)?$", re.M)  # `# ILRE_API_KEYS: "..."`: turned on
SECRET_SAMPLE = "sk-deploy-check-1,sk-deploy-check-2"  # a secretKeyRef's value


def _compose_env(environment) -> dict[str, str]:
    if isinstance(environment, list):
        return dict(item.split("=", 1) for item in environment)
    return {k: "" if v is None else str(v) for k, v in (environment or {}).items()}


def ilre_processes(path: Path) -> list[tuple[list[str], dict[str, str]]]:
    """(command line, ILRE_* environment) of each ilre container or service in a compose file or manifest,
    optional settings left commented out turned on, compose defaults (`${X:-d}`) and secrets filled in."""
    fill = lambda text: re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)  # noqa: E731
    found = []
    if path.name.startswith("docker-compose"):
        document = yaml.safe_load(OPTIONAL.sub(r"\1\2", path.read_text()))
        for service in document["services"].values():
            command = service.get("command") or []
            if command[:1] == ["ilre"]:
                env = _compose_env(service.get("environment"))
                found.append(([fill(w) for w in command], {k: fill(v) for k, v in env.items()}))
        return found
    for document in yaml.safe_load_all(path.read_text()):
        pod = (document.get("spec") or {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []):
            if (container.get("args") or [])[:1] == ["ilre"]:
                env = {e["name"]: e.get("value", SECRET_SAMPLE if "valueFrom" in e else "") for e in container.get("env", [])}
                found.append((container["args"], env))
    return found


def _image_env() -> dict[str, str]:
    """ILRE_* variables the image sets (deploy/Dockerfile's ENV), seen by every process it runs."""
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    return dict(re.findall(r"\b(ILRE_[A-Z0-9_]+)=(\S+)", text))


def _declared_names(command: str) -> set[str]:
    from ilre.cli.parser import COMMAND_SETTINGS
    from ilre.contract.settings import settings_for

    return {s.env for s in settings_for(command, *COMMAND_SETTINGS[command])}


PROCESSES = [(path, argv, env) for path in COMPOSE + MANIFESTS for argv, env in ilre_processes(path)]


def test_every_ilre_name_in_deploy_is_declared():
    from ilre.cli.parser import COMMAND_SETTINGS
    from ilre.cli.settings_table import OTHER_ENVIRONMENT

    known = {name for name, _ in OTHER_ENVIRONMENT} | {n for command in COMMAND_SETTINGS for n in _declared_names(command)}
    named = {(path.name, n) for path in DEPLOY.rglob("*") if path.is_file()
             for n in re.findall(r"\bILRE_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace"))}
    assert named and {n for _, n in named} - known == set(), sorted(named)
    assert len(PROCESSES) == sum(len(commands) for commands in COMMANDS.values())
    assert any("ILRE_API_KEYS" in env for _, _, env in PROCESSES)  # the optional keys, turned on


@pytest.mark.parametrize(("path", "argv", "env"), PROCESSES,
                         ids=[f"{p.relative_to(DEPLOY)}:{a[1]}" for p, a, _ in PROCESSES])
def test_deployed_settings_pass_print_settings(path, argv, env, tmp_path):
    from ilre.cli.settings_table import OTHER_ENVIRONMENT

    command = argv[1]
    environment = {k: v for k, v in {**_image_env(), **env}.items() if k.startswith("ILRE_")}  # HF_HOME: the hub's
    other = {name for name, _ in OTHER_ENVIRONMENT}
    assert set(environment) - other <= _declared_names(command), f"{path}: not settings of `ilre {command}`"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ILRE_")}
    run = subprocess.run([str(BIN / "ilre"), *argv[1:], "--print-settings"], capture_output=True, text=True, timeout=120,
                         env={**clean, **environment, "ILRE_CACHE_DIR": str(tmp_path)})
    assert run.returncode == 0, run.stderr
    settings = {s["env"]: s for s in json.loads(run.stdout)["settings"].values()}
    for name, value in environment.items():
        if name in settings and value:
            assert settings[name]["source"] in ("environment", "flag"), name  # a flag on the same line wins
    assert all(settings[s]["source"] == "flag" for s in settings if settings[s]["flag"] in argv[2:])


