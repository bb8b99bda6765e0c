"""`engine` for a module whose point is a flow (the cache, resuming, deepening, shares, the API), not the stored
profile's selections: `from tests.shallow import engine_on_shallow_calibration  # noqa: F401` makes the module's
`engine` the shallow calibration's (`shallow_engine`, tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module", name="engine")
def engine_on_shallow_calibration(shallow_engine):
    return shallow_engine
