"""The layers of the tree hold: every import between the package's top-level folders (module level or
inside a function) goes down the house, never up or sideways (README, "How it works"); inside a folder,
its floors hold too (SUBPACKAGE_RULES); the package never imports bench/ or tests/."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "ilre"
FOLDERS = {name: f"src/ilre/{name}" for name in ("kernels", "models", "compressor", "engine", "v1", "service",
                                                  "evaluation", "integrations", "cli")}
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


# (a module or folder inside the package, what it must not import): the floors inside the top-level folders
SUBPACKAGE_RULES = [
    ("service.queue", ("service.transport", "service.server")),  # the queues know no transport, nor what composes them
    ("service.transport", ("service.queue", "service.server", "service.sidecar")),  # the queue only through the Frontend
    ("service.sidecar", ("service.queue", "service.server")),  # the sidecar: a product on the transports' floor
    ("service.documents", ("service.queue", "service.transport", "service.server")),  # the document tier serves the queue
    ("service.common", ("service.queue", "service.transport", "service.sidecar", "service.documents", "service.server",
                        "service.client")),  # the ground floor reads no floor above it
    ("service.client", ("service.queue", "service.server")),  # the thin client: only the wire's conversion
    ("compressor.strategies", ("compressor.pipeline", "compressor.batched_prefill", "compressor.calibration")),
    ("compressor.prefill", ("compressor.strategies", "compressor.pipeline")),  # the prefill knows no strategy
    ("engine", ("engine.engine",)),  # the engine's parts serve the Engine, never the other way round
]
COMPOSERS = {"engine.engine"}  # modules a rule's folder may still hold: the one that composes the rest


def imported_modules(folder: str, path: Path) -> set[tuple[str, int]]:
    """(dotted module name below `ilre`, line) of every `ilre.*` import in `path`, relative ones resolved
    (`from . import x` gives the package's x)."""
    package = [folder, *path.relative_to(ROOT / FOLDERS[folder]).parts[:-1]]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            if node.module:
                names = [".".join(base + [node.module])] if base else [node.module]
            else:
                names = [".".join(base + [alias.name]) if base else alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ilre."):
            names = [node.module[len("ilre."):]]
        elif isinstance(node, ast.Import):
            names = [a.name[len("ilre."):] for a in node.names if a.name.startswith("ilre.")]
        found.update((name, node.lineno) for name in names if name)
    return found


def imported_folders(folder: str, path: Path) -> set[tuple[str, int]]:
    """(top-level folder, line) of every `ilre.*` import in `path` into another top-level folder."""
    return {(name.split(".")[0], line) for name, line in imported_modules(folder, path)
            if name.split(".")[0] in FOLDERS and name.split(".")[0] != folder}


def module_name(folder: str, path: Path) -> str:
    parts = [folder, *path.relative_to(ROOT / FOLDERS[folder]).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


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
    seen = {top for path in (PACKAGE / "cli").rglob("*.py") for top, _ in imported_folders("cli", path)}
    assert {"service", "evaluation", "engine"} <= seen


def test_the_floors_inside_the_folders_hold():
    wrong = []
    for folder, where in FOLDERS.items():
        for path in sorted((ROOT / where).rglob("*.py")):
            name = module_name(folder, path)
            for owner, forbidden in SUBPACKAGE_RULES:
                if not within(name, owner) or name in COMPOSERS:
                    continue
                for target, line in imported_modules(folder, path):
                    if any(within(target, f) for f in forbidden) and not within(target, name):
                        wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not wrong, "imports against the floors:\n" + "\n".join(wrong)


def test_the_package_never_imports_bench_or_tests_and_bench_goes_through_the_package():
    """bench/ measures the package as it ships: it imports `ilre.*` and the tests' launchers of real servers
    (tests/service), never the other way round."""
    wrong = []
    for folder, where in FOLDERS.items():
        for path in sorted((ROOT / where).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                modules = ([node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else
                           [a.name for a in node.names] if isinstance(node, ast.Import) else [])
                wrong += [f"{path.relative_to(ROOT)}:{node.lineno} imports {m}" for m in modules
                          if m.split(".")[0] in ("bench", "tests")]
    for path in sorted((ROOT / "bench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests") \
                    and not node.module.startswith("tests.service."):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ilre."):
                top = node.module.split(".")[1]
                if top not in FOLDERS:
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}, outside the tree")
    assert not wrong, "\n".join(wrong)


def test_the_floor_check_sees_imports():
    """Not vacuous: the composition's imports of the queue and the transports are found."""
    seen = {target for target, _ in imported_modules("service", PACKAGE / "service" / "server.py")}
    assert {"service.queue.local", "service.transport.frontend"} <= seen
    assert module_name("service", PACKAGE / "service" / "queue" / "__init__.py") == "service.queue"


def test_the_layers_cover_every_folder_of_the_package():
    """Every folder of src/ilre is a floor with its rules: a new one must be placed in the house first."""
    folders = {path.name for path in PACKAGE.iterdir() if path.is_dir() and any(path.rglob("*.py"))}
    assert folders == set(FOLDERS) == set(ALLOWED)

