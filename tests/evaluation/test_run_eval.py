"""The evaluation harness: the shared pass equals the engine, the report renders, `ilre eval --quick` runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ilre.evaluation.report.page import write_report
from ilre.evaluation.running.generation import new_token_budget
from ilre.evaluation.running.plan import ATTENTION, EvalPlan
from ilre.evaluation.running.plan_notes import caps_notes, plan_caps, widest_caps
from ilre.evaluation.running.records import Record, run_timing
from ilre.evaluation.running.run_eval import Evaluator, done_cells


def test_each_engine_row_is_the_engines_answer_to_its_request(shallow_engine):
    """run_sample sends each row to the engine as a request (one encoding shared by the rows that read it)
    and records what `Engine.compress` keeps for that request (a flow: on the shallow calibration, tests/conftest.py)."""
    engine = shallow_engine
    from ilre.contract.messages import CompressRequest
    from ilre.evaluation.running.metrics import retention
    from ilre.evaluation.tasks.ruler import generate_sample

    sample = generate_sample(engine.tokenizer, "niah_single_2", 2048, seed=1)
    evaluator = Evaluator.__new__(Evaluator)  # the engine only: no generator, no LLMLingua
    evaluator.plan, evaluator.engine, evaluator.tokenizer = EvalPlan(budget=512, e2e=False), engine, engine.tokenizer
    evaluator.native = engine.spec.native_context
    evaluator.layers = {name: engine.layer for name in ATTENTION}
    evaluator.dtype = engine.placement.dtype_name
    names = ["cascade", "cascade_units", "ilre", "ilre_nodca", "snapkv", "lagkv", "reattention", "streaming_llm"]
    records = {r.strategy: r for r in evaluator.run_sample(sample, names)}
    for name in names:
        strategy, options = ATTENTION.get(name, (name, {}))
        result = engine.compress(CompressRequest(context_ids=sample.context_ids, query_ids=sample.query_ids,
                                                 budget=512, strategy=strategy, strategy_options=dict(options),
                                                 dca="off" if name == "ilre_nodca" else "auto",
                                                 granularity="unit" if name == "cascade_units" else "token"))
        assert records[name].kept_tokens == result.compressed_tokens, name
        assert records[name].retention == retention(result.compressed_context, sample.answers), name
        assert records[name].compress_s > 0 and records[name].layer == result.layer, name


def test_a_generation_cap_never_cuts_the_gold_answer(engine):
    from ilre.evaluation.tasks.ruler import generate_sample

    tok = engine.tokenizer
    uuid = generate_sample(tok, "niah_single_3", 2048, seed=0)
    number = generate_sample(tok, "niah_single_1", 2048, seed=0)
    uuid_tokens = len(tok(" " + uuid.answers[0], add_special_tokens=False).input_ids)
    assert uuid_tokens > 30  # why a flat cap of 32 was wrong: ": " + the UUID did not fit
    assert new_token_budget(uuid, 32, tok) >= uuid_tokens + 8
    assert new_token_budget(number, 32, tok) == 32  # a 7-digit number fits: the cap holds
    assert new_token_budget(number, 0, tok) == number.tokens_to_generate == 128  # RULER's own
    assert new_token_budget(uuid, 1000, tok) == 128  # never beyond RULER's


def test_plan_validation():
    with pytest.raises(ValueError, match="tasks"):
        EvalPlan(tasks=("nope",))
    with pytest.raises(ValueError, match="strategies"):
        EvalPlan(strategies=("magic",))
    plan = EvalPlan(tasks=("vt",), lengths=(4096, 65536), samples=2, long_tasks=("niah_single_1",),
                    long_from=32768, long_samples=1)
    assert plan.cells() == [("vt", 4096, 0), ("vt", 4096, 1), ("niah_single_1", 65536, 0)]


def test_staged_runs_state_the_widest_caps():
    full_16k = EvalPlan(tasks=("niah_single_1",), lengths=(8192,), strategies=("full",), full_max_length=16384)
    full_4k = EvalPlan(tasks=("niah_single_1",), lengths=(4096,), strategies=("full", "ilre"), full_max_length=4096)
    retention_only = EvalPlan(tasks=("vt",), lengths=(4096,), strategies=("ilre",), e2e=False)
    assert plan_caps(retention_only) == {}
    caps = widest_caps(widest_caps({}, plan_caps(full_16k)), plan_caps(full_4k))
    assert caps == {"e2e_max_length": 32768, "full_max_length": 16384}
    assert "up to 16K" in caps_notes(full_4k, caps)["full"]
    assert "lingua-cap" not in caps_notes(full_4k, caps)
    assert widest_caps({"e2e_max_length": 0}, {"e2e_max_length": 4096}) == {"e2e_max_length": 0}  # 0: no cap
    assert widest_caps({"lingua_max_length": 8192}, {"lingua_max_length": 16384}) == {"lingua_max_length": 16384}


def test_a_rerun_measures_again_what_the_plan_asks_for_and_a_record_lacks():
    def record(strategy, e2e, dtype="bfloat16", layer=8):
        return {"task": "niah_single_1", "length": 4096, "index": 0, "seed": 0, "strategy": strategy, "budget": 1024,
                "e2e": e2e, "layer": layer, "dtype": dtype}

    records = [record("ilre", None), record("snapkv", 1.0), record("lagkv", None, dtype="float32"),
               record("rag", None, dtype=None), record("reattention", 0.0, layer=15), record("locret", 1.0, layer=8),
               record("actqkv", 1.0, layer=8), record("longllmlingua", 1.0, dtype="float32"),
               record("llmlingua", 1.0, layer=None)]
    layers = {name: 18 if name == "actqkv" else 8 for name in ATTENTION}  # each row at its own layer
    keys = lambda done: sorted(k[4] for k in done)  # noqa: E731
    assert keys(done_cells(records, layers, "bfloat16", lambda *_: False)) == ["ilre", "llmlingua", "locret", "rag", "snapkv"]
    assert keys(done_cells(records, layers, "bfloat16", lambda *_: True)) == ["llmlingua", "locret", "snapkv"]  # retention-only: redo
    # --any-dtype (dtype None): lagkv's and longllmlingua's float32 records now count, the layer still matters
    assert keys(done_cells(records, layers, None, lambda *_: False)) == ["ilre", "lagkv", "llmlingua", "locret", "longllmlingua",
                                                                        "rag", "snapkv"]


def test_wall_time_is_summed_per_placement_and_an_older_meta_keeps_its_own():
    old = {"placement": "cpu bfloat16", "timing": {"samples": 288, "seconds": 4274.2}}
    assert run_timing(old) == {"cpu bfloat16": {"samples": 288, "seconds": 4274.2}}
    new = {"placement": "cpu float32", "timing": {"cpu bfloat16": {"samples": 2, "seconds": 9.0},
                                                  "cpu float32": {"samples": 1, "seconds": 5.0}}}
    assert run_timing(new) == new["timing"] and run_timing(new) is not new["timing"]
    assert run_timing({}) == {}


def test_report_from_records(tmp_path):
    from dataclasses import asdict

    rows = [Record("niah_single_1", n, 0, 0, s, 1024, n - 100, 1024, ret, 1.0, e2e, answers=["1"])
            for n in (4096, 16384) for s, ret, e2e in (("ilre", 1.0, 1.0), ("snapkv", 0.0, 0.0), ("full", 1.0, 0.5))]
    rows.append(Record("vt", 4096, 0, 0, "ilre", 1024, 3996, 1024, 0.0, 1.0, None, answers=["2"]))  # not a target task
    (tmp_path / "raw.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows))
    out = write_report(tmp_path, tmp_path / "results.md", "ilre eval --test")
    text = out.read_text()
    every = text.split("## Headline")[1].split("## Retention, mean over single 1-3 + multikey 1")[0]
    targets = text.split("## Retention, mean over single 1-3 + multikey 1")[1]
    assert "| ILRe (DCA auto) | 100 [21–100] (1) | 100 [21–100] (1) |" in targets  # mean [95% Wilson] (n)
    assert "| SnapKV | 0 [0–79] (1) | 0 [0–79] (1) |" in targets
    assert "| ILRe (DCA auto) | 50 [9–91] (2) | 100 [21–100] (1) |" in every
    assert "retention on single 1-3 + multikey 1 at 16K: 100.0% (target >= 95%): met" in text
    assert (tmp_path / "results_retention.png").is_file()


def test_wall_times_of_two_dtypes_are_not_averaged_together(tmp_path):
    from dataclasses import asdict

    rows = [Record("niah_single_1", 4096, i, 0, "ilre", 1024, 3996, 1024, 1.0, seconds, None, answers=["1"], dtype=dtype)
            for i, (dtype, seconds) in enumerate((("bfloat16", 1.0), ("float32", 3.0), ("float32", 5.0)))]
    rows.append(Record("niah_single_1", 4096, 0, 0, "rag", 1024, 3996, 1024, 1.0, 0.5, None, answers=["1"]))
    (tmp_path / "raw.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows))
    (tmp_path / "meta.json").write_text(json.dumps({"placement": "cpu float32", "timing": {
        "cpu bfloat16": {"samples": 1, "seconds": 3600.0}, "cpu float32": {"samples": 2, "seconds": 7200.0}}}))
    text = write_report(tmp_path, tmp_path / "results.md", "ilre eval --test").read_text()
    walls = text.split("## Compression wall time")[1].split("## Per task")[0]
    assert "| ILRe (DCA auto), bfloat16 | 1.00 (1) |" in walls and "| ILRe (DCA auto), float32 | 4.00 (2) |" in walls
    assert "| RAG (BM25) | 0.50 (1) |" in walls
    assert "1 samples in 1.0 h on cpu bfloat16; 2 samples in 2.0 h on cpu float32" in text
    assert "| ILRe (DCA auto) | 100 [44–100] (3) |" in text  # retention pools both dtypes


@pytest.mark.slow
def test_ilre_eval_quick_runs_from_the_command_line(tmp_path):
    ilre = Path(sys.executable).with_name("ilre")
    env = {**os.environ, "ILRE_LINGUA_PYTHON": str(tmp_path / "none")}
    done = subprocess.run([str(ilre), "eval", "--quick", "--results-dir", str(tmp_path / "r"),
                           "--output", str(tmp_path / "results.md")], capture_output=True, text=True, env=env,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "r" / "raw.jsonl").read_text().splitlines()]
    assert {r["strategy"] for r in records} == {"ilre", "snapkv", "streaming_llm", "rag"}
    assert all(r["e2e"] is not None for r in records)
    kept = {r["strategy"]: sum(x["retention"] for x in records if x["strategy"] == r["strategy"]) for r in records}
    assert kept["ilre"] == 2 and kept["ilre"] >= kept["streaming_llm"]  # ILRe keeps both needles at 4K
    page = (tmp_path / "results.md").read_text()
    assert "## Retention, mean over single 1-3 + multikey 1" in page and "## Headline" in page
    timing = json.loads((tmp_path / "r" / "meta.json").read_text())["timing"]  # per placement, e.g. "cpu float32"
    (placement, spent), = timing.items()
    assert spent["samples"] == 2 and spent["seconds"] > 0  # 2 tasks x 1 sample, wall time summed
    assert f"{spent['samples']} samples in" in page and f"on {placement}" in page


def test_wilson_intervals_on_known_cases():
    from ilre.evaluation.report.intervals import wilson

    assert wilson(0.5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson(1.0, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)  # all kept: not a point
    assert wilson(0.0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(0.9, 100) == pytest.approx((0.8256, 0.9448), abs=1e-4)
    low, high = wilson(0.5, 1000)
    assert high - low < wilson(0.5, 10)[1] - wilson(0.5, 10)[0]  # narrows with n
    with pytest.raises(ValueError, match="n: must be >= 1"):
        wilson(0.5, 0)


def test_a_results_dir_of_its_own_gets_its_page_beside_it(tmp_path):
    """`--results-dir` without `--output` writes RESULTS_DIR/results.md and leaves docs/results.md alone."""
    ilre = Path(sys.executable).with_name("ilre")
    results = tmp_path / "explore"
    results.mkdir()
    lines = (Path(__file__).parents[2] / "results/eval/raw.jsonl").read_text().splitlines()[:40]
    (results / "raw.jsonl").write_text("\n".join(lines) + "\n")
    done = subprocess.run([str(ilre), "eval", "--report-only", "--results-dir", str(results)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["report"] == str(results / "results.md")
    assert "## Headline" in (results / "results.md").read_text()
    assert not (tmp_path / "docs").exists()


def test_every_row_that_falls_back_is_charged_the_whole_contexts_pass(engine, monkeypatch):
    """The first cascade row that falls back encodes the whole context to l_R; the next reads what it left, and
    is charged that pass too, as rows sharing the coarse layer's encoding each are."""
    from ilre.evaluation.tasks.ruler import generate_sample

    for name in ("cascade", "cascade_units"):
        monkeypatch.setitem(ATTENTION, name, ("cascade", {"deepen_below": 1.0}))  # always fall back
    sample = generate_sample(engine.tokenizer, "niah_single_2", 4096, seed=1)
    evaluator = Evaluator.__new__(Evaluator)
    evaluator.plan, evaluator.engine, evaluator.tokenizer = EvalPlan(budget=128, e2e=False), engine, engine.tokenizer
    evaluator.native = engine.spec.native_context
    evaluator.layers = {name: engine.layer for name in ATTENTION}
    evaluator.dtype = engine.placement.dtype_name
    tokens, units = evaluator.run_sample(sample, ["cascade", "cascade_units"])
    assert tokens.fell_back and units.fell_back and tokens.peak == units.peak < 1.0
    never = ("cascade", {"deepen_below": 0.0})
    monkeypatch.setitem(ATTENTION, "cascade_candidates", never)
    engine.documents.clear()
    alone = evaluator.run_sample(sample, ["cascade_candidates"])[0]
    assert alone.fell_back is False and alone.peak == tokens.peak
    # the units row read the encoding the token row made, and is charged its time (the candidates' pass alone
    # costs a fraction of it at l_R = 19 against the coarse layer 8)
    assert units.compress_s > 0.7 * tokens.compress_s
    assert units.compress_s > 1.5 * alone.compress_s


def test_the_results_page_opens_with_a_headline_of_at_most_150_lines(tmp_path):
    """The shipped records (results/eval) rendered: the headline, a per-task table and the targets fit one
    screen before the analysis begins; every task run has a row there."""
    from pathlib import Path

    from ilre.evaluation.report.page import ANALYSIS

    shipped = Path(__file__).resolve().parents[2] / "results" / "eval"
    lines = write_report(shipped, tmp_path / "results.md", "ilre eval --test").read_text().splitlines()
    head = lines[:lines.index(ANALYSIS)]
    assert len(head) <= 150
    assert "## Headline: retention over every task run, per length" in head and "## Targets" in head
    table = head[head.index("## Per task"):head.index("## Targets")]
    tasks = {json.loads(line)["task"] for line in (shipped / "raw.jsonl").read_text().splitlines()}
    assert {row.split(" | ")[0].lstrip("| ") for row in table if row.startswith("| ") and "---" not in row} - {"task"} == tasks
