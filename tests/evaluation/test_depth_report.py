"""The default against plain ILRe at l_R on the results page, on records written out by hand."""

from __future__ import annotations

from ilre.evaluation.report.depth import as_configured, default_against_l_r, depth_section


def record(strategy: str, task: str, index: int, retention: float, length: int = 16384, layer: int = 19,
           budget: int = 1024) -> dict:
    return {"task": task, "length": length, "index": index, "seed": 0, "strategy": strategy, "retention": retention,
            "layer": layer, "budget": budget}


def test_the_default_is_its_candidates_row_and_at_4k_its_whole_cascade_row():
    records = [record("cascade", "vt", 0, 1.0, length=4096), record("cascade", "vt", 0, 0.0),  # 16K: may have fallen back
               record("cascade_candidates", "vt", 0, 0.5), record("ilre", "vt", 0, 1.0)]
    assert as_configured(records) == [record("cascade", "vt", 0, 1.0, length=4096), record("cascade", "vt", 0, 0.5),
                                      record("ilre", "vt", 0, 1.0)]


def test_pairs_need_both_rows_l_r_s_layer_and_the_budget():
    records = [record("cascade_candidates", "vt", 0, 1.0), record("ilre", "vt", 0, 0.0),
               record("cascade_candidates", "vt", 1, 1.0), record("ilre", "vt", 1, 1.0, layer=8),
               record("cascade_candidates", "vt", 2, 1.0, budget=512), record("ilre", "vt", 2, 0.0, budget=512),
               record("ilre", "cwe", 0, 1.0)]
    (length, c), = default_against_l_r(records).items()
    assert length == 16384 and c["n"] == 1 and c["diff"] == 100.0


def test_the_section_gives_each_lengths_verdict_and_where_it_trails():
    records = []
    for i in range(10):  # 16K: vt leads by 100 on every sample; 32K: cwe trails on two of ten
        records += [record("cascade_candidates", "vt", i, 1.0), record("ilre", "vt", i, 0.0)]
        records += [record("cascade_candidates", "cwe", i, 0.0 if i < 2 else 1.0, length=32768),
                    record("ilre", "cwe", i, 1.0, length=32768)]
    lines = depth_section(records)
    assert "| 16K | 10 (1) | +100.0 [+100.0, +100.0] | leads |" in lines
    row = next(line for line in lines if line.startswith("| 32K | 10 (1) | -20.0 "))
    assert row.endswith("| ties |")  # two of ten: the interval reaches zero
    assert "| 32K | cwe | -20.0 |" in lines and not any(line.startswith("| 16K | vt |") for line in lines)
    assert depth_section([record("ilre", "vt", 0, 1.0)]) == []
