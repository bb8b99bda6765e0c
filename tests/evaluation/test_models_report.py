"""The page's models side by side (evaluation/report/models.py): two results folders of `ilre eval`, their defaults
per length and task with intervals, the paired difference, and the window line; the page names the model that ran
and what its default is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ilre.evaluation.report.page import write_report


def _folder(root: Path, model: str, native: int, kept: dict[tuple[str, int], list[float]], e2e: bool = False) -> Path:
    folder = root / model
    folder.mkdir()
    rows = [{"task": task, "length": length, "index": i, "seed": 0, "strategy": "cascade", "budget": 1024,
             "context_tokens": length - 50, "kept_tokens": 1024, "retention": v, "compress_s": 1.0,
             "e2e": v if e2e else None, "answers": ["1"], "layer": 6}
            for (task, length), values in kept.items() for i, v in enumerate(values)]
    (folder / "raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "meta.json").write_text(json.dumps({"model": model, "layer": 6, "layers": {"cascade": 6},
                                                  "native_context": native}))
    return folder


def test_two_models_side_by_side_with_intervals_and_the_window_line(tmp_path):
    small = _folder(tmp_path, "SmolLM2-135M-Instruct", 8192, {
        ("niah_single_3", 4096): [1.0] * 10, ("niah_paraphrase", 16384): [0.0] * 10,
        ("niah_paraphrase", 32768): [0.0] * 10, ("niah_single_3", 16384): [1.0] * 10}, e2e=True)
    gemma = _folder(tmp_path, "gemma-3-270m", 32768, {
        ("niah_single_3", 4096): [1.0] * 10, ("niah_paraphrase", 16384): [1.0] * 10,
        ("niah_paraphrase", 32768): [1.0] * 8 + [0.0] * 2, ("niah_single_3", 16384): [1.0] * 10})
    text = write_report(small, tmp_path / "page.md", "ilre eval --report-only", (gemma,)).read_text()
    section = text.split("## Models side by side: SmolLM2-135M-Instruct and gemma-3-270m")[1].split("\n## ")[0]
    assert "- **SmolLM2-135M-Instruct**: cascade, coarse layer 8, l_R 6" in section  # its shipped profile's coarse layer
    assert "- **gemma-3-270m**: plain ILRe at l_R 6 (no cascade)" in section
    assert "| SmolLM2-135M-Instruct | 100 [72–100] (10) | 50 [30–70] (20) | 0 [0–28] (10) |" in section
    assert "| gemma-3-270m | 100 [72–100] (10) | 100 [84–100] (20) | 80 [49–94] (10) |" in section
    assert "- **16K**: gemma-3-270m leads SmolLM2-135M-Instruct (+50.0 points [+30.0, +70.0], 20 paired samples" in section
    assert "| niah_paraphrase | – | 0 [0–28] (10) / 100 [72–100] (10) | 0 [0–28] (10) / 80 [49–94] (10) |" in section
    assert ("niah_paraphrase past SmolLM2-135M-Instruct's window, within gemma-3-270m's (16K, 32K)**: gemma-3-270m "
            "keeps 18 of 20, SmolLM2-135M-Instruct 0 of 20") in section
    assert "32768-token window closes part of the gap" in section
    assert "SmolLM2-135M-Instruct with all its layers generates" in text  # the reader that generated, named


def test_a_retention_only_run_of_a_model_without_a_cascade_says_so(tmp_path):
    gemma = _folder(tmp_path, "gemma-3-270m", 32768, {("niah_single_3", 4096): [1.0] * 3})
    text = write_report(gemma, tmp_path / "page.md", "ilre eval --report-only").read_text()
    assert "generates greedily" not in text  # no end-to-end record: no reader to name
    assert "| default: plain ILRe at l_R 6 (no cascade) | 100 [44–100] (3) |" in text
    assert "ILRe cascade |" not in text and "## Models side by side" not in text


def test_beside_a_folder_without_results_is_refused_naming_the_flag(tmp_path):
    gemma = _folder(tmp_path, "gemma-3-270m", 32768, {("niah_single_3", 4096): [1.0]})
    ilre = Path(sys.executable).with_name("ilre")
    done = subprocess.run([str(ilre), "eval", "--report-only", "--results-dir", str(gemma), "--beside",
                           str(tmp_path / "missing")], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "beside: no raw results in" in done.stderr and "Traceback" not in done.stderr
