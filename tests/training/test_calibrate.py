"""`ilre calibrate` end to end on the embedded model, on a grid small enough for CI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_calibrate_writes_profile_and_heatmaps(tmp_path: Path):
    cmd = [sys.executable, "-m", "ilre.cli", "calibrate", "--lengths", "1536", "--digits", "8",
           "--depths", "2", "--long-lengths", "2560", "--long-digits", "8", "--long-depths", "1", "--distractors", "2",
           "--profile-dir", str(tmp_path / "profiles"), "--plots", str(tmp_path / "plots")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    profile = json.loads((tmp_path / "profiles" / "smollm2-135m-instruct.json").read_text())
    details = profile["details"]
    assert profile["retrieval_layer"] == printed["retrieval_layer"] == details["choices"]["default"]
    recall = {int(k): v for k, v in details["recall_multi"].items()}
    long = {int(k): v for k, v in details["recall_long_multi"].items()}
    assert sorted(recall) == sorted(long) == list(range(1, 31))
    best = max(recall.values())
    tied = [l for l, v in recall.items() if v == best]
    assert details["choices"]["fast"] == min(tied)
    assert profile["retrieval_layer"] == min(tied, key=lambda l: (-long[l], l))  # ties broken at long range
    assert long[details["choices"]["robust"]] == max(long.values())
    assert details["cost"]["fast"] == 1.0 and details["samples"] == 3
    assert printed["choices"] == {**details["choices"], "default": profile["retrieval_layer"]}
    cascade, why = details["strategies"]["cascade"], details["cascade"]
    assert cascade["coarse_layer"] == details["choices"]["fast"]
    costs = {float(f): c for f, c in why["costs"].items()}
    within = [f for f, c in costs.items() if c <= 1.3]
    assert cascade["candidates"] == (max(within) if within else min(costs))  # the largest within the cost cap
    assert details["cost"]["cascade"] == costs[cascade["candidates"]]
    assert set(why["candidate_recall_long"]) == set(why["costs"])
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {
        "smollm2-135m-instruct-single.png", "smollm2-135m-instruct-multi.png",
        "smollm2-135m-instruct-single-long.png", "smollm2-135m-instruct-multi-long.png"}
    # run again: every sample is found where the first run kept it, and the profile is the same
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "(3 measured already)" in again.stderr
    rerun = json.loads((tmp_path / "profiles" / "smollm2-135m-instruct.json").read_text())["details"]
    assert {**rerun, "date": None} == {**details, "date": None}


def test_a_sample_line_cut_short_is_measured_again(tmp_path: Path):
    from ilre.training.calibration_samples import SampleLog

    path = tmp_path / "samples.jsonl"
    log = SampleLog({"plan": 1}, path)
    log.add(("grid", 1536, 8, 0), {"multi": [1.0, 0.0]})
    with path.open("a") as out:
        out.write('{"key": ["grid", 1536, 8, 1], "hi')  # killed mid-line
    again = SampleLog({"plan": 1}, path)
    assert again.get(("grid", 1536, 8, 0)) == {"multi": [1.0, 0.0]} and again.get(("grid", 1536, 8, 1)) is None
    other, same = SampleLog({"plan": 2}), SampleLog({"plan": 1})  # in the cache: another calibration, a file of its own
    try:
        assert other.path != same.path and other.path.parent == same.path.parent
    finally:
        other.path.unlink()
        same.path.unlink()


def test_calibrate_rejects_lengths_within_budget(tmp_path: Path):
    cmd = [sys.executable, "-m", "ilre.cli", "calibrate", "--lengths", "512", "--profile-dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "lengths: every context must be longer than the budget" in proc.stderr
    assert "Traceback" not in proc.stderr
