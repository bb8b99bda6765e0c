"""The layers of the tree hold: every import between the package's top-level folders (module level or
inside a function) goes down the house, never up or sideways (README, "How it works"); inside a folder,
its floors hold too (SUBPACKAGE_RULES); no modules import each other in a circle; the package never imports
bench/ or tests/."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "ilre"
FOLDERS = {name: f"src/ilre/{name}" for name in ("contract", "kernels", "models", "compressor", "engine", "v1", "service",
                                                  "evaluation", "training", "integrations", "cli")}
# what each folder may import; evaluation and service never import each other, only the CLI composes them;
# training (the profile, Locret's weights) reads evaluation's task generators only (SUBPACKAGE_RULES)
ALLOWED = {
    "contract": set(),  # the ground floor: every folder may import it (below)
    "kernels": set(),
    "models": {"kernels"},
    "compressor": {"kernels", "models"},
    "engine": {"kernels", "models", "compressor"},
    "v1": set(),
    "service": {"kernels", "models", "compressor", "engine", "v1"},
    "evaluation": {"kernels", "models", "compressor", "engine"},
    "training": {"kernels", "models", "compressor", "engine", "evaluation"},
    "integrations": {"compressor", "engine", "service", "v1"},
    "cli": {"kernels", "models", "compressor", "engine", "v1", "service", "evaluation", "training", "integrations"},
}
for _folder in ALLOWED:
    if _folder != "contract":
        ALLOWED[_folder].add("contract")


# (a module or folder inside the package, what it must not import): the floors inside the top-level folders
SUBPACKAGE_RULES = [
    ("service.queue", ("service.transport", "service.server", "service.worker", "service.documents")),  # the queues
    # know no transport, nor what composes them (the server, the worker), nor the document tier
    ("service.transport", ("service.queue", "service.server", "service.sidecar")),  # the queue only through the Frontend
    ("service.sidecar", ("service.queue", "service.server")),  # the sidecar: a product on the transports' floor
    ("service.documents", ("service.queue", "service.transport", "service.server")),  # the document tier serves the worker
    ("service.common", ("service.queue", "service.transport", "service.sidecar", "service.documents", "service.server",
                        "service.client")),  # the ground floor reads no floor above it
    ("service.client", ("service.queue", "service.server")),  # the thin client: only the wire's conversion
    ("compressor.strategies", ("compressor.pipeline", "compressor.batched_prefill", "compressor.calibration")),
    ("compressor.prefill", ("compressor.strategies", "compressor.pipeline")),  # the prefill knows no strategy
    ("engine", ("engine.engine",)),  # the engine's parts serve the Engine, never the other way round
    ("evaluation.tasks", ("evaluation.running", "evaluation.report")),  # the samples know nothing of what runs them
    ("evaluation.running", ("evaluation.report",)),  # the runs record raw results; the page is written from them
    ("training", ("evaluation.running", "evaluation.report", "evaluation.extra")),  # the task generators only
]
COMPOSERS = {"engine.engine"}  # modules a rule's folder may still hold: the one that composes the rest


def imports(folder: str, path: Path) -> list[tuple[str, tuple[str, ...], int]]:
    """(dotted module name below `ilre`, the names imported from it, line) of every `ilre.*` import in `path`
    (module level, in a function or under TYPE_CHECKING), relative ones resolved (`from . import x` gives the
    package's x)."""
    package = [folder, *path.relative_to(ROOT / FOLDERS[folder]).parts[:-1]]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[tuple[str, tuple[str, ...]]] = []
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            if node.module:
                names = [(".".join(base + [node.module]) if base else node.module, tuple(a.name for a in node.names))]
            else:
                names = [(".".join(base + [alias.name]) if base else alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ilre."):
            names = [(node.module[len("ilre."):], tuple(a.name for a in node.names))]
        elif isinstance(node, ast.Import):
            names = [(a.name[len("ilre."):], ()) for a in node.names if a.name.startswith("ilre.")]
        found += [(name, imported, node.lineno) for name, imported in names if name]
    return found


def imported_modules(folder: str, path: Path) -> set[tuple[str, int]]:
    """(dotted module name below `ilre`, line) of every `ilre.*` import in `path` (see `imports`)."""
    return {(name, line) for name, _, line in imports(folder, path)}


def imported_folders(folder: str, path: Path) -> set[tuple[str, int]]:
    """(top-level folder, line) of every `ilre.*` import in `path` into another top-level folder."""
    return {(name.split(".")[0], line) for name, line in imported_modules(folder, path)
            if name.split(".")[0] in FOLDERS and name.split(".")[0] != folder}


def module_name(folder: str, path: Path) -> str:
    parts = [folder, *path.relative_to(ROOT / FOLDERS[folder]).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def module_file(name: str) -> Path | None:
    """The file of the package's module `name` (dotted below `ilre`), None when it is no module of the package."""
    base = PACKAGE.joinpath(*name.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {module it imports: line}, over every module of the package; `from a import b` reaches a and,
    where b is a module of its own, b too."""
    graph: dict[str, dict[str, int]] = {}
    for folder, where in FOLDERS.items():
        for path in sorted((ROOT / where).rglob("*.py")):
            name = module_name(folder, path)
            edges = graph.setdefault(name, {})
            for target, imported, line in imports(folder, path):
                for candidate in (target, *(f"{target}.{n}" for n in imported)):
                    found = module_file(candidate)
                    if found is not None and found != path:
                        top = found.relative_to(PACKAGE).parts[0]
                        edges.setdefault(module_name(top, found), line)
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One circle (its modules in import order, the first again at the end) per group of modules that import
    each other, directly or through others."""
    cycles, done = [], set()
    for start in sorted(graph):
        if start in done:
            continue
        paths, queue = {start: [start]}, [start]  # breadth first: the shortest way back to `start`
        while queue:
            here = queue.pop(0)
            for there in sorted(graph.get(here, {})):
                if there == start:
                    cycle = paths[here] + [start]
                    cycles.append(cycle)
                    done.update(cycle)
                    queue = []
                    break
                if there not in paths:
                    paths[there] = paths[here] + [there]
                    queue.append(there)
    return cycles


# known circles outside evaluation/ and training/, each with why it stays (none today)
KNOWN_CYCLES: set[frozenset[str]] = set()


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
    assert {"service", "evaluation", "training", "engine"} <= seen


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


def test_no_modules_import_each_other_in_a_circle():
    """No module reaches itself through its imports (module level, in a function or under TYPE_CHECKING)."""
    graph = import_graph()
    found = [c for c in import_cycles(graph) if frozenset(c) not in KNOWN_CYCLES]
    wrong = [" -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(c, c[1:])) + f" -> {c[-1]}" for c in found]
    assert not wrong, "modules importing each other in a circle:\n" + "\n".join(wrong)
    assert not any(within(m, "evaluation") or within(m, "training") for c in KNOWN_CYCLES for m in c)


def test_the_cycle_check_sees_circles():
    """Not vacuous: a circle of three is found, a chain is not, and the graph holds the CLI's imports."""
    assert import_cycles({"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b": 1}, "b": {"c": 2}, "c": {}}) == []
    graph = import_graph()
    assert {"evaluation.running.run_eval", "training.calibrate"} <= set(graph["cli.main"])
    assert "evaluation.tasks.words" in graph["evaluation.tasks.structured"]


def test_the_package_never_imports_bench_or_tests_and_bench_goes_through_the_package():
    """bench/ measures the package as it ships: it imports `ilre.*` and the tests' launchers of real servers
    (tests/service, and on hosts of their own tests/hosts), never the other way round."""
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
                    and not node.module.startswith(("tests.service.", "tests.hosts.")):
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



def test_the_contract_imports_neither_torch_nor_the_engine():
    """Every module of the contract package, imported in a fresh interpreter, brings in no torch and nothing of
    ilre outside the contract (a thin client, the CLI's parser and an adapter read the messages without a model)."""
    import subprocess
    import sys

    modules = sorted(f"ilre.contract.{p.stem}" for p in (PACKAGE / "contract").glob("*.py") if p.stem != "__init__")
    assert "ilre.contract.messages" in modules and len(modules) >= 7
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "print(sorted(m for m in sys.modules if m == 'torch' or (m.startswith('ilre.') "
              "and not m.startswith('ilre.contract'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"the contract imported {out.strip()}"
