"""The real files' section of the results page, on records written out by hand."""

from __future__ import annotations

import json
from pathlib import Path

from ilre.evaluation.report.real_files import section


def test_each_corpus_and_length_is_a_row_of_tokens_against_units_with_how_often_the_default_fell_back(tmp_path: Path):
    rows = []
    for index, (token_kept, unit_kept, fell) in enumerate([(False, True, True), (True, True, False),
                                                           (False, False, True), (True, True, False)]):
        for granularity, kept in (("token", token_kept), ("unit", unit_kept)):
            rows.append({"corpus": "dpkg_log", "length": 16384, "index": index, "granularity": granularity,
                         "kept": kept, "line_whole": kept and granularity == "unit", "header_kept": None,
                         "fell_back": fell})
    rows.append({"corpus": "dpkg_log", "length": 32768, "index": 0, "granularity": "unit", "kept": True,
                 "line_whole": True, "header_kept": None})  # no token pair: no row
    path = tmp_path / "real_files.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = section(path)
    table = [line for line in lines if line.startswith("| dpkg_log")]
    assert len(table) == 1
    cells = [c.strip() for c in table[0].strip("|").split("|")]
    assert cells[:2] == ["dpkg_log", "16K"]
    assert cells[2].startswith("50 [") and cells[2].endswith("/ 0")  # tokens: 2 of 4 kept, no line whole
    assert cells[3].startswith("75 [") and cells[3].endswith("/ 75")  # units: 3 of 4 kept and whole
    assert cells[4].startswith("+25.0 [")
    assert cells[5:] == ["4", "2 of 4"]


def test_records_from_before_the_fallback_was_recorded_say_so(tmp_path: Path):
    path = tmp_path / "real_files.jsonl"
    path.write_text("".join(json.dumps({"corpus": "pypi_tsv", "length": 16384, "index": 0, "granularity": g,
                                        "kept": True, "line_whole": True, "header_kept": True}) + "\n"
                            for g in ("token", "unit")))
    row = next(line for line in section(path) if line.startswith("| pypi_tsv"))
    assert row.endswith("| 1 | not recorded |") and "100 [" in row and "/ 100 / 100" in row
    assert section(tmp_path / "missing.jsonl") == []


def test_an_earlier_measurement_fills_only_the_cells_the_newer_one_lacks(tmp_path: Path):
    def write(path: Path, corpus: str, length: int, kept: bool, **extra) -> Path:
        with path.open("a") as f:
            for g in ("token", "unit"):
                f.write(json.dumps({"corpus": corpus, "length": length, "index": 0, "granularity": g, "kept": kept,
                                    "line_whole": kept, "header_kept": None, **extra}) + "\n")
        return path

    newer = write(tmp_path / "new.jsonl", "dpkg_log", 16384, True, fell_back=False)
    earlier = write(tmp_path / "old.jsonl", "dpkg_log", 16384, False)
    write(earlier, "dpkg_log", 32768, False)
    rows = [line for line in section(newer, earlier) if line.startswith("| dpkg_log")]
    assert len(rows) == 2
    assert "| 16K | 100 [" in rows[0] and rows[0].endswith("| 0 of 1 |")
    assert "| 32K | 0 [" in rows[1] and rows[1].endswith("| not recorded |")
