"""Shared fixtures: the embedded model (real weights), loaded once per session."""

from __future__ import annotations

import os

import pytest

# float32 for the engine here and every `ilre` process a test starts (ILRE_DTYPE): tests compare answers
# across processes and batches exactly, and in bfloat16 a batch's matmuls round differently from one
# request's on CPUs with AMX, so a near-tie may break the other way. Tests of bfloat16 name it.
DTYPE = "float32"
os.environ.setdefault("ILRE_DTYPE", DTYPE)


@pytest.fixture(scope="session")
def engine():
    """An Engine on the embedded SmolLM2-135M-Instruct at its profiled retrieval layer, in float32."""
    from ilre.engine.engine import Engine, EngineConfig

    return Engine(EngineConfig(dtype=DTYPE))
