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

from ilre.service.cli.main import build_parser

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


@pytest.mark.parametrize("path", COMPOSE + MANIFESTS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_ilre_command_lines_parse(path):
    commands = [cmd for doc in yaml.safe_load_all(path.read_text()) for cmd in ilre_commands(doc)]
    if path.parent.name == "sidecar":
        assert any(cmd[1] == "sidecar" for cmd in commands)
    for command in commands:
        words = [re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", word) for word in command[1:]]  # compose defaults
        build_parser().parse_args(words)  # SystemExit (a failure) on an unknown flag or a bad value
