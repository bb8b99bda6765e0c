"""Shared fixtures: the embedded model (real weights), loaded once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# float32 for the engine here and every `ilre` process a test starts (ILRE_DTYPE): tests compare answers
# across processes and batches exactly, and in bfloat16 a batch's matmuls round differently from one
# request's on CPUs with AMX, so a near-tie may break the other way. Tests of bfloat16 name it.
DTYPE = "float32"
os.environ.setdefault("ILRE_DTYPE", DTYPE)
# No background deepening in the `ilre` servers tests start (ILRE_DEEPEN): it runs in whatever idle moment a
# test leaves, so a document's later queries would switch to the deepened path at a time no test controls
# (and it would take the 2 cores from the next test). tests/engine/test_deepening.py and the gateway's
# retrieve test turn it on.
os.environ.setdefault("ILRE_DEEPEN", "off")
# Under `make test`'s two workers (pytest-xdist) a worker and every process its tests start (`ilre` servers,
# llama-server, vLLM, SGLang: tests/service/engines.py) compute on one thread: two workers of two threads each
# on 2 cores spin against each other (measured: the 16K needle test 640 s instead of 174).
if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

# `make test` runs two pytest workers (pytest-xdist, --dist loadgroup). A module is one group, so its
# module-scoped servers start once; the wheel's and the thin client's tests share the package built once. The
# longest modules are handed out first (as measured), so that no long one is left for the end.
LONGEST_FIRST = [  # worker-seconds under `make test` (2 workers, 2 cores without AVX-512), as last measured
    "service/test_sidecar_engines.py",  # 377: vLLM and SGLang, a start each
    "service/test_sidecar.py",  # 233
    "package",  # test_thin_client 92 + test_wheel 72: one package build
    "integrations/test_litellm.py",  # 122: two LiteLLM proxy starts at once
    "test_needle.py",  # 256, as two groups of depths
    "integrations/test_llmlingua.py",  # 107
    "service/test_sidecar_replies.py",  # ~90: each API's answers, passthrough reasons, frozen per key, retrieve
    "cli/test_batch_job.py",  # ~80: a dozen `ilre batch` processes
    "cli/test_batch_vllm.py",  # ~60: one `vllm run-batch`
    "hosts/test_partitions.py",  # ~90: seven hosts, two workers, faults by link
    "evaluation/test_run_eval.py",  # 119
    "service/test_gateway.py",  # 111: one LiteLLM proxy start
    "engine/test_document_shares.py",  # 104
    "service/test_redis_failover.py",  # 96
    "service/test_redis_queue.py",  # 80
    "cli/test_serve_cli.py",  # 88
    "engine/test_growing.py",  # 83
    "engine/test_documents.py",  # 81
    "test_strategies_needle.py",  # 72
    "engine/test_document_scope.py",  # 66
    "engine/test_deepening.py",  # 55
    "integrations/test_integrations.py",  # 52
    "service/test_gateway_routes.py",  # 56
]
TESTS = Path(__file__).parent
PACKAGE_MODULES = {"test_wheel.py", "test_thin_client.py"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which names each test's group from these marks
def pytest_collection_modifyitems(config, items):
    """One xdist group per module (the wheel's and thin client's modules one group, "package"); the groups of
    LONGEST_FIRST first, in its order, the rest as collected."""
    def group(item) -> str:
        module = item.path.relative_to(TESTS).as_posix()
        return "package" if module in PACKAGE_MODULES else module

    for item in items:
        item.add_marker(pytest.mark.xdist_group(group(item)))
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(group(item), len(rank)))  # stable: the rest keep their order


@pytest.fixture(scope="session")
def stored_engine():
    """An Engine on the embedded SmolLM2-135M-Instruct at its profiled retrieval layer, in float32."""
    from ilre.engine.engine import Engine, EngineConfig

    return Engine(EngineConfig(dtype=DTYPE))


@pytest.fixture(scope="session")
def engine(stored_engine):
    """The stored profile's engine (`stored_engine`); a module about a flow overrides it with `shallow_engine`."""
    return stored_engine


SHALLOW_LAYER, SHALLOW_COARSE = 6, 3


def shallow_profile():
    """The embedded model's stored profile made shallow: l_R = 6, the cascade's coarse layer 3 ("fast"), its other
    options as stored. The same weights, tokenizer and code paths at ~3x fewer layer-tokens a request, for tests whose
    point is a flow (the cache, resuming, deepening, shares, batching), not the stored profile's selections."""
    from dataclasses import replace

    from ilre.models.loader import load_spec, resolve_checkpoint
    from ilre.models.profiles import load_profile

    checkpoint = resolve_checkpoint(None)
    stored = load_profile(checkpoint.name, load_spec(checkpoint.path).num_layers)
    cascade = {**stored.details["strategies"]["cascade"], "coarse_layer": SHALLOW_COARSE}
    details = {**stored.details, "choices": {"fast": SHALLOW_COARSE, "default": SHALLOW_LAYER, "robust": SHALLOW_LAYER},
               "strategies": {**stored.details["strategies"], "cascade": cascade}}
    return replace(stored, retrieval_layer=SHALLOW_LAYER, details=details)


@pytest.fixture(scope="session")
def shallow_engine():
    """An Engine on the embedded model in float32 under `shallow_profile()` (a module about a flow overrides
    `engine` with it)."""
    from ilre.engine.engine import Engine, EngineConfig

    return Engine(EngineConfig(dtype=DTYPE), profile=shallow_profile())


@pytest.fixture(scope="session")
def built_package(tmp_path_factory):
    """(source, wheel): the tracked files copied alone (what a clone holds), then `python -m build` of them (the
    sdist, then the wheel from it), built once for the wheel's and the thin client's tests."""
    import sys

    from tests.test_wheel import run, tracked_copy

    root = tmp_path_factory.mktemp("package")
    source = tracked_copy(root / "source")
    run(sys.executable, "-m", "build", "--outdir", str(root / "dist"), str(source))
    return source, next((root / "dist").glob("ilre-*.whl"))


# The service's fixtures (a redis-server per module, the in-process service, an OTLP receiver) serve the tests of
# every folder: the engine's, the CLI's and the integrations' start real servers too.
from tests.service.conftest import local_service, otlp, redis_server  # noqa: E402,F401
