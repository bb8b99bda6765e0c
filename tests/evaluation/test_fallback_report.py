"""The fallback section: which samples fall back, and the threshold replayed, on records written out by hand."""

from __future__ import annotations

import pytest

from ilre.evaluation.report.fallback import (falls_back, fallback_section, replay, seconds_lines, share_table,
                                             uncharged_lines)


def record(strategy: str, task: str, index: int, retention: float, length: int = 16384, **extra) -> dict:
    return {"task": task, "length": length, "index": index, "seed": 0, "strategy": strategy,
            "retention": retention, **extra}


def test_a_cascade_row_says_itself_and_a_candidates_row_says_it_by_its_peak():
    records = [record("cascade", "fwe", 0, 1.0, peak=0.3, fell_back=False),  # e.g. measured with deepen_below 0.2
               record("cascade_candidates", "fwe", 0, 1.0, peak=0.3),
               record("cascade_candidates", "fwe", 1, 1.0, peak=0.59),
               record("cascade_candidates", "fwe", 2, 1.0, peak=0.6),
               record("cascade", "vt", 0, 1.0, peak=None, fell_back=None)]  # a whole context: no candidates
    assert falls_back(records, 0.6) == {("fwe", 16384, 0, 0): False, ("fwe", 16384, 1, 0): True,
                                        ("fwe", 16384, 2, 0): False}
    assert share_table(records, 0.6) == ["| task | 16K |", "| --- | ---: |", "| fwe | 1/3 |"]


def test_the_replay_takes_the_whole_context_exactly_below_each_threshold():
    peaks = [0.2, 0.45, 0.55, 0.65, 0.9]
    candidates = [0.0, 1.0, 0.0, 1.0, 1.0]
    whole = [1.0, 0.0, 1.0, 0.0, 1.0]
    records = [record("cascade_candidates", "niah_paraphrase", i, candidates[i], peak=p) for i, p in enumerate(peaks)]
    records += [record("ilre_fast_half", "niah_paraphrase", i, whole[i]) for i in range(5)]
    records += [record("ilre_fast_half", "niah_paraphrase", 9, 1.0)]  # no candidates row: not replayed
    thresholds = (0.0, 0.5, 0.6, 1.0)
    got = replay(records, thresholds)[16384]
    expected_kept, expected_fall = [], []
    for t in thresholds:  # the rule, sample by sample
        kept = falling = 0.0
        for i, p in enumerate(peaks):
            kept += whole[i] if p < t else candidates[i]
            falling += p < t
        expected_kept.append(100 * kept / 5)
        expected_fall.append(100 * falling / 5)
    assert got["samples"] == 5 and got["tasks"] == 1
    assert got["kept"] == pytest.approx(expected_kept) and got["fall"] == pytest.approx(expected_fall)
    assert got["kept"] == pytest.approx([60.0, 60.0, 80.0, 60.0])
    assert got["by_task"] == {"niah_paraphrase": pytest.approx([60.0, 60.0, 80.0, 60.0])}


def test_the_section_is_empty_without_peaks_and_names_the_threshold_with_them():
    assert fallback_section([record("cascade", "fwe", 0, 1.0)]) == []
    records = [record("cascade_candidates", "fwe", 0, 1.0, peak=0.4), record("ilre_fast_half", "fwe", 0, 1.0)]
    lines = fallback_section(records, threshold=0.6, thresholds=(0.0, 0.6))
    assert "`deepen_below` (0.6 when these records were measured" in lines[2]
    assert "| fwe | 1/1 |" in lines
    assert "| 16K | 1 (1 tasks) | 100.0 (0) | 100.0 (100) |" in lines
    assert "No task's retention depends on the threshold." in lines


def test_the_times_are_split_by_whether_the_sample_fell_back():
    records = [record("cascade", "fwe", 0, 1.0, peak=0.3, fell_back=True, compress_s=50.0),
               record("cascade", "fwe", 1, 1.0, peak=0.4, fell_back=True, compress_s=54.0),
               record("cascade", "vt", 0, 1.0, peak=0.9, fell_back=False, compress_s=15.0),
               record("cascade_units", "vt", 0, 1.0, peak=0.9, fell_back=False, compress_s=99.0)]
    assert seconds_lines(records) == ["- 16K: fell back 52.0 s (50.0-54.0, 2 samples); did not 15.0 s (15.0-15.0, 1 samples)"]


def test_times_that_lack_part_of_their_cost_are_counted_per_row_and_length():
    why = "the pass was not charged"
    records = [record("cascade_units", "fwe", i, 1.0, compress_s=5.0, timing=why if i < 2 else None) for i in range(4)]
    records += [record("cascade_units", "fwe", 0, 1.0, length=32768, compress_s=9.0, timing=why),
                record("cascade", "fwe", 0, 1.0, compress_s=15.0),
                record("cascade_units", "fwe", 1, 1.0, length=65536, compress_s=20.0)]
    assert uncharged_lines(records) == [f"- cascade_units: 16K 2 of 4, 32K 1 of 1 samples: {why}"]
    assert uncharged_lines([r for r in records if not r.get("timing")]) == []
