"""`ilre calibrate` end to end on the embedded model, on a grid small enough for CI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_calibrate_writes_profile_and_heatmaps(tmp_path: Path):
    cmd = [sys.executable, "-m", "ilre.service.cli", "calibrate", "--lengths", "1536", "--digits", "8",
           "--depths", "2", "--profile-dir", str(tmp_path / "profiles"), "--plots", str(tmp_path / "plots")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    profile = json.loads((tmp_path / "profiles" / "smollm2-135m-instruct.json").read_text())
    assert profile["retrieval_layer"] == printed["retrieval_layer"]
    recall = {int(k): v for k, v in profile["details"]["recall_multi"].items()}
    assert sorted(recall) == list(range(1, 31))
    best = max(recall.values())
    assert profile["retrieval_layer"] == min(l for l, v in recall.items() if v == best)
    assert profile["details"]["samples"] == 2
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {
        "smollm2-135m-instruct-single.png", "smollm2-135m-instruct-multi.png"}


def test_calibrate_rejects_lengths_within_budget(tmp_path: Path):
    cmd = [sys.executable, "-m", "ilre.service.cli", "calibrate", "--lengths", "512", "--profile-dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "lengths: every context must be longer than the budget" in proc.stderr
    assert "Traceback" not in proc.stderr
