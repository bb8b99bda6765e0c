"""Structured-data and code tasks (evaluation/tasks/structured.py): sized, deterministic, one answer, the right shape."""

from __future__ import annotations

import ast
import csv
import json
import re

import pytest

from ilre.evaluation.tasks.ruler import TASKS, generate_sample

STRUCTURED = ("records_jsonl", "records_json", "records_csv", "code_python", "logs", "markdown_table")


@pytest.fixture(scope="module")
def tokenizer():
    from ilre.models.loader import load_tokenizer, resolve_checkpoint

    return load_tokenizer(resolve_checkpoint(None).path)


def test_the_tasks_are_registered():
    for task in STRUCTURED:
        assert TASKS[task].kind == task and TASKS[task].metric == "all" and TASKS[task].tokens_to_generate == 32


@pytest.mark.parametrize("task,length", [(t, 4096) for t in STRUCTURED] + [("code_python", 32768),
                                                                           ("records_jsonl", 32768)])
def test_fits_is_deterministic_and_has_one_answer(tokenizer, task, length):
    sample = generate_sample(tokenizer, task, length, seed=5, index=2)
    total = len(sample.context_ids) + len(sample.query_ids) + TASKS[task].tokens_to_generate
    assert 0.9 * length <= total <= length
    assert generate_sample(tokenizer, task, length, seed=5, index=2) == sample
    other = generate_sample(tokenizer, task, length, seed=5, index=3)
    assert (other.context, other.answers) != (sample.context, sample.answers)
    (answer,) = sample.answers
    assert re.fullmatch(r"\d{7}", answer) and sample.context.count(answer) == 1
    assert answer not in sample.query
    key = sample.details["keys"][0]
    assert key in sample.question and key in sample.answer_prefix and sample.context.count(key) >= 1
    assert 0 <= sample.details["depths"][0] <= 100


def _lines(sample):
    instruction, data = sample.context.split("\n", 1)
    assert instruction.startswith("Below ")
    return instruction, data


def _asked_field(sample):
    return re.search(r"What is the (\w+) of", sample.question).group(1)


@pytest.mark.parametrize("index", range(3))
def test_records_jsonl_is_one_json_object_per_line(tokenizer, index):
    sample = generate_sample(tokenizer, "records_jsonl", 4096, seed=1, index=index)
    instruction, data = _lines(sample)
    assert "`list_jobs`" in instruction and "one JSON record per line" in instruction
    records = [json.loads(line) for line in data.split("\n")]
    assert len(records) == sample.details["units"] and len({r["id"] for r in records}) == len(records)
    assert all(list(r) == list(records[0]) for r in records)  # the same keys, in the same order
    field = _asked_field(sample)
    assert field in ("duration_ms", "bytes_processed", "rows_written", "peak_memory_kb")
    asked = [r for r in records if r["id"] == sample.details["keys"][0]]
    assert len(asked) == 1 and str(asked[0][field]) == sample.answers[0]
    assert sum(isinstance(v, int) and v >= 10**6 for v in records[0].values()) >= 3  # several such fields


def test_records_json_is_one_pretty_printed_document(tokenizer):
    sample = generate_sample(tokenizer, "records_json", 4096, seed=1)
    _, data = _lines(sample)
    document = json.loads(data)
    assert set(document) == {"results", "count"} and document["count"] == len(document["results"]) > 10
    assert data == json.dumps(document, indent=2)  # each field on its own line
    asked = [r for r in document["results"] if r["id"] == sample.details["keys"][0]]
    assert len(asked) == 1 and str(asked[0][_asked_field(sample)]) == sample.answers[0]


def test_records_csv_has_a_header_and_rows_of_equal_width(tokenizer):
    sample = generate_sample(tokenizer, "records_csv", 4096, seed=1)
    instruction, data = _lines(sample)
    assert ".csv`" in instruction
    header, *rows = list(csv.reader(data.split("\n")))
    assert header[0] == "project" and len(rows) == sample.details["units"] > 10
    assert all(len(row) == len(header) for row in rows)
    field = _asked_field(sample)
    assert field in header and "whose project is" in sample.question
    asked = [row for row in rows if row[0] == sample.details["keys"][0]]
    assert len(asked) == 1 and asked[0][header.index(field)] == sample.answers[0]


def test_logs_are_timestamped_lines_with_one_asked_request(tokenizer):
    sample = generate_sample(tokenizer, "logs", 4096, seed=1)
    _, data = _lines(sample)
    lines = data.split("\n")
    assert len(lines) == sample.details["units"]
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (INFO |WARN |ERROR|DEBUG) [a-z-]+ "
    assert all(re.match(stamp, line) for line in lines)
    requests = [line for line in lines if " request_id=" in line]
    assert len(requests) > 0.7 * len(lines)
    assert len({re.search(r"request_id=(\S+)", line).group(1) for line in requests}) == len(requests)
    assert all(re.search(r" duration_ms=\d{7} ", line) for line in requests)
    assert len({line.split()[1] for line in lines}) >= 2 and len({line.split()[2] for line in requests}) >= 3
    asked = [line for line in requests if f"request_id={sample.details['keys'][0]} " in line]
    assert len(asked) == 1 and f"duration_ms={sample.answers[0]} " in asked[0]


def test_markdown_table_rows_have_the_same_columns(tokenizer):
    sample = generate_sample(tokenizer, "markdown_table", 4096, seed=1)
    assert "\n# Fleet inventory\n" in sample.context
    rows = [line for line in sample.context.split("\n") if line.startswith("|")]
    assert len(rows) == sample.details["units"] + 2 and re.fullmatch(r"\|(---\|)+", rows[1])
    assert len({row.count("|") for row in rows}) == 1
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    field = _asked_field(sample)
    asked = [[c.strip() for c in row.strip("|").split("|")] for row in rows[2:]
             if row.startswith(f"| {sample.details['keys'][0]} |")]
    assert len(asked) == 1 and asked[0][header.index(field)] == sample.answers[0]


def _sections(context: str) -> dict[str, str]:
    parts = re.split(r"^# file: (\w+)\.py\n", context, flags=re.M)
    assert parts[0].startswith("Below are source files")
    return dict(zip(parts[1::2], parts[2::2]))


@pytest.mark.parametrize("length,index", [(4096, 0), (4096, 1), (4096, 2), (16384, 0), (1024, 0)])
def test_code_python_plants_the_assignment_in_a_body_and_every_file_parses(tokenizer, length, index):
    sample = generate_sample(tokenizer, "code_python", length, seed=4, index=index)
    sections = _sections(sample.context)
    assert list(sections) == sample.details["files"]
    trees = {name: ast.parse(source) for name, source in sections.items()}  # every section parses
    var = sample.details["keys"][0]
    assert re.fullmatch(r"retry_budget_[a-z]+", var) and f"what value is assigned to {var}?" in sample.question
    names = [var, *sample.details["distractors"]]
    assert len(names) == 4 and len(set(names)) == 4
    values = {}
    for name, tree in trees.items():
        lines = sections[name].split("\n")
        for parent in ast.walk(tree):
            for child in getattr(parent, "body", []) if isinstance(getattr(parent, "body", None), list) else []:
                if isinstance(child, ast.Assign) and isinstance(child.targets[0], ast.Name) \
                        and child.targets[0].id.startswith("retry_budget_"):
                    values[child.targets[0].id] = child.value.value
                    if length >= 4096:  # in a def/class body, indented below its def line
                        assert isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                        assert child.col_offset > parent.col_offset
                        line = lines[child.lineno - 1]
                        assert line == " " * child.col_offset + f"{child.targets[0].id} = {child.value.value}"
    assert sorted(values) == sorted(names)
    assert str(values[var]) == sample.answers[0] and len(set(values.values())) == 4
    assert all(sample.context.count(f"{n} = ") == 1 for n in names)
