"""The other-corpus check sends the engine requests: its records are the engine's answers, and a rerun
measures only what is missing."""

from __future__ import annotations

import json

import torch

from ilre.compressor.calibration import needle_kept
from ilre.compressor.strategies import make_strategy
from ilre.contract.messages import CompressRequest
from ilre.evaluation.report.other_corpus import section
from ilre.evaluation.running.other_corpus import run_other_corpus
from ilre.evaluation.tasks.passkey import make_passkey_sample


def test_records_are_the_engines_answers_and_a_rerun_adds_nothing(shallow_engine, tmp_path):
    """A flow: on the shallow calibration (tests/conftest.py), its cascade and plain ILRe at its own two layers."""
    engine, output = shallow_engine, tmp_path / "other.jsonl"
    run_other_corpus([2048], 2, 3, output, budget=256, progress=lambda _: None, engine=engine)
    records = [json.loads(line) for line in output.read_text().splitlines()]
    coarse, l_r = engine.with_profile(make_strategy("cascade")).coarse_layer, engine.layer
    assert sorted({r["strategy"] for r in records}) == sorted(["cascade", f"ilre@{coarse}", f"ilre@{l_r}"])
    assert len(records) == 6
    for record in records:
        sample = make_passkey_sample(engine.tokenizer, 2048, record["depth"] / 2, 8, seed=11, source="pydoc",
                                     distractors=3)
        name = record["strategy"]
        fields = {"strategy": "cascade"} if name == "cascade" else {"strategy": "ilre", "layer": int(name.split("@")[1])}
        result = engine.compress(CompressRequest(context_ids=sample.context_ids, query_ids=sample.query_ids, budget=256,
                                                 **fields))
        assert record["kept"] == needle_kept(torch.tensor(result.kept_indices), sample.needle), record
    run_other_corpus([2048], 2, 3, output, budget=256, progress=lambda _: None, engine=engine)
    assert len(output.read_text().splitlines()) == 6  # nothing measured twice
    assert any("plain ILRe at layer" in line for line in section(output))
