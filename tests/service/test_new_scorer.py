"""A scorer of one's own is one file: a module written here, outside the package, defines a `Strategy` with a name
and `score` only, registers it, and a request naming it runs through the service (HTTP) with the default reading
(one query pass at l_R); the reply keeps what its scores say, and its name is refused again for another class."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from ilre.compressor.strategies import STRATEGIES, register_strategy
from ilre.contract.messages import CompressRequest

from .conftest import QUERY, context, http_client

SCORER = '''
from dataclasses import dataclass

import torch

from ilre.compressor.strategies import register_strategy
from ilre.compressor.strategies.base import ScoreInputs, Strategy


@register_strategy
@dataclass(frozen=True)
class EveryOther(Strategy):
    """Keeps even positions first: the score is 1 at even positions, 0 at odd ones, ties broken by position."""

    name = "every_other"

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        assert inputs.attention is not None and inputs.attention.numel() == inputs.length  # the default reading's
        positions = torch.arange(inputs.length, dtype=torch.float32)
        return (positions % 2 == 0).float() + positions / (inputs.length * 4.0)
'''


@pytest.fixture()
def every_other(tmp_path):
    path = tmp_path / "every_other_scorer.py"
    path.write_text(SCORER)
    spec = importlib.util.spec_from_file_location("every_other_scorer", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module.EveryOther
    STRATEGIES.pop("every_other", None)
    sys.modules.pop(spec.name, None)


def test_a_scorer_in_one_file_runs_through_the_service(local_service, engine, every_other):
    body = {"context": context(5, repeats=6), "query": QUERY, "budget": 40, "strategy": "every_other",
            "granularity": "token"}
    with http_client(local_service) as http:
        reply = http.post("/v1/compress", json=body)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    sink = engine.config.prefill.sink
    kept = data["kept_indices"]
    assert data["compressed_tokens"] == 40 and kept[:sink] == list(range(sink))
    assert all(i % 2 == 0 for i in kept[sink:])  # its scores chose, even positions first
    assert kept == engine.compress(CompressRequest(**body)).kept_indices

    class Other(every_other):
        name = "every_other"

    with pytest.raises(ValueError, match="taken by EveryOther"):
        register_strategy(Other)
