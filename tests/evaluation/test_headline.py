"""The headline's paired comparison: bootstrap intervals on known cases and the lead / tie / trail verdicts."""

import pytest

from ilre.evaluation.report.headline import best_ours, comparison, headline, retention_by_sample
from ilre.evaluation.report.intervals import paired_difference
from ilre.evaluation.report.page import LABELS
from ilre.evaluation.running.plan import STRATEGIES


def test_paired_difference_on_known_cases():
    assert paired_difference([(1.0, 0.0)] * 20) == (1.0, 1.0, 1.0)  # every sample agrees: a point
    mean, low, high = paired_difference([(1.0, 0.0), (0.0, 1.0)] * 20)
    assert mean == 0.0 and low < -0.1 and high > 0.1  # balanced wins and losses: the interval holds zero
    mean, low, high = paired_difference([(1.0, 0.0)] * 8 + [(0.0, 0.0)] * 2)
    assert mean == pytest.approx(0.8) and 0.5 <= low < 0.8 < high <= 1.0
    assert paired_difference([(1.0, 0.0)] * 8 + [(0.0, 0.0)] * 2) == (mean, low, high)  # a fixed seed: stable
    wide = paired_difference([(1.0, 0.0), (0.0, 0.0)] * 5)
    narrow = paired_difference([(1.0, 0.0), (0.0, 0.0)] * 50)
    assert narrow[2] - narrow[1] < wide[2] - wide[1]  # narrows with n
    with pytest.raises(ValueError, match="pairs"):
        paired_difference([])


def _records(strategy: str, kept: list[float], task: str = "niah_single_1", length: int = 16384) -> list[dict]:
    return [{"task": task, "length": length, "index": i, "seed": 0, "strategy": strategy, "retention": v}
            for i, v in enumerate(kept)]


def test_verdicts_need_the_interval_to_exclude_zero():
    records = (_records("ilre", [1.0] * 12) + _records("rag", [0.0] * 6 + [1.0] * 6)
               + _records("streaming_llm", [1.0] * 11 + [0.0]) + _records("longllmlingua", [1.0, 1.0]))
    samples = retention_by_sample(records, 16384)
    assert comparison(samples, "ilre", "rag")["verdict"] == "leads"
    assert comparison(samples, "ilre", "streaming_llm")["verdict"] == "ties"  # one sample of twelve apart
    lingua = comparison(samples, "ilre", "longllmlingua")
    assert (lingua["n"], lingua["verdict"]) == (2, "ties")  # compared on the two samples it ran
    behind = retention_by_sample(_records("ilre", [0.0] * 10) + _records("rag", [1.0] * 10), 16384)
    c = comparison(behind, "ilre", "rag")
    assert (c["verdict"], c["by_task"]) == ("trails", [("niah_single_1", -100.0)])


def test_best_ours_needs_the_most_samples():
    records = _records("ilre", [1.0] * 3 + [0.0]) + _records("snapkv", [1.0, 1.0])  # snapkv: fewer, easier samples
    assert best_ours(retention_by_sample(records, 16384)) == "ilre"
    assert best_ours(retention_by_sample(_records("rag", [1.0]), 16384)) is None


def test_headline_states_each_length():
    records = _records("ilre", [1.0] * 10) + _records("rag", [0.0] * 10) + _records("ilre", [1.0] * 4, length=32768) \
        + _records("rag", [1.0] * 4, length=32768)
    text = "\n".join(headline(records, LABELS, STRATEGIES))
    assert "| ILRe (DCA auto) | 100 [72–100] (10) | 100 [51–100] (4) |" in text
    assert "- **16K**: ILRe (DCA auto) leads RAG (BM25) (+100.0 points [+100.0, +100.0], 10 paired samples of 1 task" in text
    assert "- **32K**: ILRe (DCA auto) ties RAG (BM25) (+0.0 points [+0.0, +0.0], 4 paired samples of 1 task; no task differs)" in text
    assert "(the default)" not in text  # ILRe is the best: one statement per length
    better = _records("ilre_fast_too", [1.0] * 10) + _records("cascade", [1.0] * 5 + [0.0] * 5) + _records("rag", [0.0] * 10)
    lines = headline(better, LABELS, STRATEGIES)
    assert "- **16K**: ILRe + layer 8 leads RAG (BM25) (+100.0 points [+100.0, +100.0]" in "\n".join(lines)
    assert any(line.startswith("- **16K**: ILRe cascade (the default) leads RAG (BM25) (+50.0 points [") for line in lines)


def test_a_target_is_met_as_a_lead_only_when_the_interval_excludes_zero():
    from ilre.evaluation.report.page import _ahead

    lead = comparison({"ilre": {("vt", 0, i): 1.0 for i in range(10)}, "rag": {("vt", 0, i): 0.0 for i in range(10)}},
                      "ilre", "rag")
    assert _ahead(lead) == "met (interval excludes zero)"
    few = {"ilre": {("vt", 0, 0): 1.0, ("vt", 0, 1): 0.0}, "rag": {("vt", 0, 0): 0.0, ("vt", 0, 1): 0.0}}
    assert "a tie" in _ahead(comparison(few, "ilre", "rag"))  # +50 on 2 samples, [+0, +100]: no lead
    assert _ahead(comparison(few, "rag", "ilre")) == "NOT met"


def test_an_option_is_compared_with_the_strategy_without_it():
    from ilre.evaluation.report.headline import variant_section

    records = (_records("ilre", [0.0] * 10, task="vt") + _records("ilre_fast_too", [1.0] * 10, task="vt")
               + _records("ilre", [1.0] * 10) + _records("ilre_fast_too", [1.0] * 10)
               + _records("ilre", [1.0] * 3, length=4096) + _records("rag", [0.0] * 3, length=4096))
    text = "\n".join(variant_section(records, LABELS, {"no shared words": ("vt",)}))
    assert "| ILRe + layer 8 vs ILRe (DCA auto) | 16K | all tasks both ran | +50.0 [" in text
    assert "| 20 | leads | vt +100 |" in text
    assert "| ILRe + layer 8 vs ILRe (DCA auto) | 16K | no shared words | +100.0 [+100.0, +100.0] | 10 | leads | vt +100 |" in text
    assert "4K" not in text  # the option did not run there: nothing to compare
    only_vt = variant_section(records[:20], LABELS, {"no shared words": ("vt",)})
    assert sum(line.startswith("| ILRe + layer 8") for line in only_vt) == 1  # the group is all it ran: one row
    assert variant_section(_records("ilre", [1.0] * 3), LABELS, {}) == []
