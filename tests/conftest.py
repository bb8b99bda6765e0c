"""Shared fixtures: the embedded model (real weights), loaded once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def engine():
    """An Engine on the embedded SmolLM2-135M-Instruct at its profiled retrieval layer."""
    from ilre.service.api.engine import Engine

    return Engine()
