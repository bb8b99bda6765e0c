"""deploy/ holds files no container engine runs here: each compose file is checked against the
Compose specification's schema, each Kubernetes manifest against the Kubernetes schemas, and each
`ilre ...` command line in them against the real argument parser."""

from __future__ import annotations

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
