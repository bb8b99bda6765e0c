"""Shared fixtures: the embedded model (real weights), loaded once per session."""

from __future__ import annotations

import os

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
@pytest.fixture(scope="session")
def engine():
    """An Engine on the embedded SmolLM2-135M-Instruct at its profiled retrieval layer, in float32."""
    from ilre.engine.engine import Engine, EngineConfig

    return Engine(EngineConfig(dtype=DTYPE))


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
