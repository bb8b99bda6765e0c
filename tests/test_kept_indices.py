"""Every selection path keeps what it kept before the reading plans were split from the scorers: bench/kept_indices.py
on some of the evaluation's tasks (the default at 4K, every strategy, two questions of one context, a document asked
again) against the indices recorded on the tree before (results/bench/kept-indices.json). On the CPU the
record was made on (its model name and capability) they are the same, index for index; on another, float rounding may
move a boundary token."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "results" / "bench" / "kept-indices.json"


def test_the_selections_keep_the_recorded_indices():
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "kept_indices.py"), "--rows",
                          "4k-default,strategies,queries,documents", "--tasks", "niah_multikey_1,records_json,logs"],
                         capture_output=True, text=True, timeout=1200, cwd=ROOT)
    rows = re.findall(r"^  (\S+)\s+(same|differs: ([\d.]+)%.*|not recorded)$", run.stdout, re.M)
    assert len(rows) == 3 + 2 * 7 + 1 + 1, run.stdout + run.stderr  # two of the three tasks are the strategies'
    assert not [name for name, outcome, _ in rows if outcome == "not recorded"]
    here, recorded = re.search(r"^kept indices, float32, one thread, (.*), recorded on (.*)$", run.stdout, re.M).groups()
    assert recorded.endswith(f"({json.loads(RECORD.read_text())['capability']})")
    if here == recorded:
        assert run.returncode == 0 and all(outcome == "same" for _, outcome, _ in rows), run.stdout
    else:
        assert all(outcome == "same" or float(share) >= 98.0 for _, outcome, share in rows), run.stdout
