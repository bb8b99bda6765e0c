"""The layers of the tree hold: every import between the package's top-level folders (module level or
inside a function) goes down the house, never up or sideways (README, "How it works")."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"kernels": "kernels", "models": "models", "compressor": "compressor", "engine": "engine",
           "v1": "proto/ilre/v1", "service": "service", "evaluation": "evaluation", "integrations": "integrations",
           "cli": "cli"}
# what each folder may import; evaluation and service never import each other, only the CLI composes them
ALLOWED = {
    "kernels": set(),
    "models": {"kernels"},
    "compressor": {"kernels", "models"},
    "engine": {"kernels", "models", "compressor"},
    "v1": set(),
    "service": {"kernels", "models", "compressor", "engine", "v1"},
    "evaluation": {"kernels", "models", "compressor", "engine"},
    "integrations": {"compressor", "engine", "service", "v1"},
    "cli": {"kernels", "models", "compressor", "engine", "v1", "service", "evaluation", "integrations"},
}


def imported_folders(folder: str, path: Path) -> set[tuple[str, int]]:
    """(top-level folder, line) of every `ilre.*` import in `path`, relative ones resolved."""
    package = [folder, *path.relative_to(ROOT / FOLDERS[folder]).parts[:-1]]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            names = [".".join(base + ([node.module] if node.module else []))] if base else [node.module or ""]
            if not base:  # `from .. import x` at the top: x is the folder
                names = [node.module or alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ilre."):
            names = [node.module[len("ilre."):]]
        elif isinstance(node, ast.Import):
            names = [a.name[len("ilre."):] for a in node.names if a.name.startswith("ilre.")]
        for name in names:
            top = name.split(".")[0]
            if top in FOLDERS and top != folder:
                found.add((top, node.lineno))
    return found


def test_every_import_goes_down_the_house():
    wrong = []
    for folder, where in FOLDERS.items():
        for path in sorted((ROOT / where).rglob("*.py")):
            for top, line in imported_folders(folder, path):
                if top not in ALLOWED[folder]:
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports {top}")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_the_check_sees_imports():
    """Not vacuous: the CLI's imports of the service and the evaluation are found."""
    seen = {top for path in (ROOT / "cli").rglob("*.py") for top, _ in imported_folders("cli", path)}
    assert {"service", "evaluation", "engine"} <= seen
