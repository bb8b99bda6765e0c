"""Segmentation into units (compressor/units.py) against literal expected units, with the real tokenizer."""

from __future__ import annotations

import json
import random
import time

import numpy as np
import pytest
import torch

from ilre.compressor.units import kept_spans, unit_bounds
from ilre.models.token_bytes import context_bytes, token_bytes


@pytest.fixture(scope="module")
def tokenizer():
    from ilre.models.embedded import embedded_checkpoint
    from ilre.models.loader import load_tokenizer

    return load_tokenizer(embedded_checkpoint())


def ids_of(tokenizer, text: str) -> torch.Tensor:
    return torch.tensor(tokenizer(text, add_special_tokens=False).input_ids, dtype=torch.int64)


def units(tokenizer, text: str, cap: int = 48, spelled_back: bool = True, record: int | None = None) -> list[str]:
    """The units of `text` as strings; checks that they are runs of whole tokens covering the text (a unit
    may end inside a character the tokenizer splits over two tokens: decoded with replacement then)."""
    ids = ids_of(tokenizer, text)
    layout = context_bytes(token_bytes(tokenizer), ids)
    if spelled_back:  # the byte table spells the IDs as the tokenizer decodes them
        assert layout.data.tobytes() == tokenizer.decode(ids).encode()
    bounds = unit_bounds(layout, cap, record).tolist()
    assert bounds[0] == 0 and bounds[-1] == len(ids) and all(a < b for a, b in zip(bounds, bounds[1:]))
    assert max(b - a for a, b in zip(bounds, bounds[1:])) <= max(cap, record or cap)
    pieces = [layout.data[layout.starts[a]: layout.starts[b]].tobytes() for a, b in zip(bounds, bounds[1:])]
    assert b"".join(pieces) == layout.data.tobytes()
    return [piece.decode(errors="replace") for piece in pieces]


def test_sentences_with_abbreviations_decimals_and_versions(tokenizer):
    text = ("Dr. Smith paid 3.14 dollars for v2.0.1 of it. He left! Did he? Yes, he did. "
            "It costs approx. five dollars, e.g. in Paris. J. R. Tolkien wrote it.")
    assert units(tokenizer, text) == ["Dr. Smith paid 3.14 dollars for v2.0.1 of it.", " He left!", " Did he?",
                                      " Yes, he did.", " It costs approx. five dollars, e.g. in Paris.",
                                      " J. R. Tolkien wrote it."]


def test_a_lowercase_word_after_a_dot_does_not_start_a_sentence(tokenizer):
    assert units(tokenizer, "The fee is 5 p.a. and no more. Then stop.") == ["The fee is 5 p.a. and no more.",
                                                                            " Then stop."]


def test_other_scripts_end_sentences_without_spaces(tokenizer):
    assert units(tokenizer, "今天天气很好。我们去公园吧！你去吗？好的。") == ["今天天气很好。", "我们去公园吧！", "你去吗？", "好的。"]
    assert units(tokenizer, "Hello there. Привет, мир. 東京は大きい。") == ["Hello there.", " Привет, мир.", " 東京は大きい。"]


def test_lines_crlf_and_empty_lines(tokenizer):
    logs = "2026-01-01 INFO start\n2026-01-01 WARN slow disk\n\n\n2026-01-01 INFO done"
    assert units(tokenizer, logs) == ["2026-01-01 INFO start\n", "2026-01-01 WARN slow disk\n\n\n", "2026-01-01 INFO done"]
    assert units(tokenizer, "id,value\r\n1,2\r\n\r\n3,4\r\n") == ["id,value\r\n", "1,2\r\n\r\n", "3,4\r\n"]
    assert units(tokenizer, "\n\nstart") == ["\n\n", "start"]


def test_markdown_headings_paragraphs_lists_and_tables(tokenizer):
    text = ("# Title\n\nIntro text here. Second sentence.\n\n- item one\n- item two\n\n"
            "| key | value |\n|---|---|\n| a | 1 |\n")
    assert units(tokenizer, text) == ["# Title\n\n", "Intro text here.", " Second sentence.\n\n", "- item one\n",
                                      "- item two\n\n", "| key | value |\n", "|---|---|\n", "| a | 1 |\n"]


def test_code_lines(tokenizer):
    code = "def f(x):\n    y = x + 1\n    return y\n"  # the tokenizer reads a line break and indentation as one token
    assert units(tokenizer, code) == ["def f(x):\n   ", " y = x + 1\n   ", " return y\n"]


def test_a_call_across_lines_short_enough_stays_one_unit(tokenizer):
    code = "result = compute(\n    alpha=1,\n    beta=2,\n)\nprint(result)\n"
    assert units(tokenizer, code) == ["result = compute(\n    alpha=1,\n    beta=2,\n)\n", "print(result)\n"]


def test_json_records_on_one_line_are_the_units_of_a_long_array(tokenizer):
    records = [{"id": f"rec-{k}", "name": "a, b", "value": k} for k in range(3)]
    text = json.dumps(records)
    assert units(tokenizer, text, cap=24) == ['[{"id": "rec-0", "name": "a, b", "value": 0},',
                                               ' {"id": "rec-1", "name": "a, b", "value": 1},',
                                               ' {"id": "rec-2", "name": "a, b", "value": 2}]']


def test_pretty_printed_records_stay_whole_across_lines(tokenizer):
    text = json.dumps({"results": [{"id": "x", "v": 1}, {"id": "y", "v": 2}]}, indent=2)
    assert units(tokenizer, text, cap=24) == ['{\n ', ' "results": [\n   ', ' {\n      "id": "x",\n      "v": 1\n    },\n   ',
                                              ' {\n      "id": "y",\n      "v": 2\n    }\n ', ' ]\n', '}']


def test_a_record_longer_than_the_cap_is_cut_between_its_members(tokenizer):
    record = {"id": "rec-7", "status": "failed", "owner": "data", "latency_ms": 123456, "retries": 3}
    text = json.dumps([record, record])
    got = units(tokenizer, text, cap=16)
    assert got == ['[{"id": "rec-7",', ' "status": "failed",', ' "owner": "data",', ' "latency_ms": 123456,',
                   ' "retries": 3},'] * 2 or got[:5] == ['[{"id": "rec-7",', ' "status": "failed",', ' "owner": "data",',
                                                        ' "latency_ms": 123456,', ' "retries": 3},']


def test_a_record_within_the_record_cap_stays_whole_and_one_over_it_is_cut_between_members(tokenizer):
    record = {"id": "rec-7", "status": "failed", "owner": "data", "latency_ms": 123456, "retries": 3}
    text = json.dumps({"results": [record, {**record, "id": "rec-8"}]}, indent=2)
    record_text = json.dumps(record, indent=2).replace("\n", "\n    ")  # as it sits in the array
    n = len(ids_of(tokenizer, record_text))
    assert 16 < n < 64
    got = units(tokenizer, text, cap=16, record=64)
    assert got[2] == " " + record_text + ",\n   " and got[3].startswith(' {\n      "id": "rec-8",') and len(got) == 6
    assert all(len(ids_of(tokenizer, u)) <= 16 for i, u in enumerate(got) if i not in (2, 3))  # only records exceed the cap
    cut = units(tokenizer, text, cap=16, record=n - 8)  # the record over the record cap: members, as with no record cap
    assert cut == units(tokenizer, text, cap=16)
    assert ' "status": "failed",\n' in "|".join(cut) and len(cut) > 10


def test_a_comma_inside_a_string_does_not_cut(tokenizer):
    text = json.dumps([{"note": "one, two, three, four, five, six"}, {"note": "x"}])
    assert units(tokenizer, text, cap=20) == ['[{"note": "one, two, three, four, five, six"},', ' {"note": "x"}]']


def test_an_overlong_sentence_is_cut_at_clauses_then_into_windows(tokenizer):
    text = "This long sentence has clauses, many of them; it goes on: and on, without end in sight at all here."
    assert units(tokenizer, text, cap=8) == ["This long sentence has clauses,", " many of them;", " it goes on:",
                                             " and on,", " without end in sight at all here."]
    line = "x" * 300
    sizes = np.diff(unit_bounds(context_bytes(token_bytes(tokenizer), ids_of(tokenizer, line)), 16).numpy())
    assert sizes.max() <= 16 and sizes.max() - sizes.min() <= 1  # equal windows


def test_chat_markers_are_units_of_their_own(tokenizer):
    text = "<|im_start|>user\nHi there. Bye.<|im_end|>\n<|im_start|>assistant\nHello."
    assert units(tokenizer, text) == ["<|im_start|>", "user\n", "Hi there.", " Bye.", "<|im_end|>", "\n",
                                      "<|im_start|>", "assistant\n", "Hello."]


def test_nesting_10000_deep_random_bytes_and_mixed_scripts_degrade_to_windows(tokenizer):
    rng = random.Random(0)
    texts = ["[" * 10000 + "]" * 10000, '{"a": ' * 5000 + "1" + "}" * 5000,
             bytes(rng.randrange(256) for _ in range(20000)).decode("utf-8", "replace"),
             "".join(rng.choice("abc 。,.!?{}[]()\"\\\n東京мир") for _ in range(20000))]
    for text in texts:
        units(tokenizer, text, cap=48, spelled_back=False)  # (invalid UTF-8 decodes lossily) whole tokens, covering the text, none over the cap


def test_a_million_token_single_line_in_under_two_seconds(tokenizer):
    table = token_bytes(tokenizer)
    word = ids_of(tokenizer, " lorem ipsum, dolor sit amet")
    ids = word.repeat(1_000_000 // word.numel() + 1)[:1_000_000]
    layout = context_bytes(table, ids)
    start = time.perf_counter()
    bounds = unit_bounds(layout, 48)
    seconds = time.perf_counter() - start
    assert bounds[0] == 0 and bounds[-1] == 1_000_000 and int(torch.diff(bounds).max()) <= 48
    assert seconds < 2.0, seconds


def test_kept_spans_are_character_offsets_of_each_kept_unit(tokenizer):
    text = "Über die Brücke. Second one here. Third one is kept. Fourth."
    ids = ids_of(tokenizer, text)
    layout = context_bytes(token_bytes(tokenizer), ids)
    bounds = unit_bounds(layout, 48)
    second, fourth = bounds[1:3].tolist(), bounds[3:5].tolist()
    kept = torch.tensor([0, *range(*second), *range(*fourth)])
    spans = kept_spans(bounds, kept, layout)
    assert [text[a:b] for a, b in spans] == [text[: len(tokenizer.decode(ids[:1]))], " Second one here.", " Fourth."]
