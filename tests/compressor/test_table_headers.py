"""Table headers (compressor/table_headers.py) against literal expected headers, with the real tokenizer."""

from __future__ import annotations

import time

import pytest
import torch

from ilre.compressor.units import document_units
from ilre.models.token_bytes import context_bytes, token_bytes


@pytest.fixture(scope="module")
def tokenizer():
    from ilre.models.embedded import embedded_checkpoint
    from ilre.models.loader import load_tokenizer

    return load_tokenizer(embedded_checkpoint())


def headed(tokenizer, text: str) -> list[tuple[str, str]]:
    """(unit, its header) as strings for every unit that has one."""
    ids = torch.tensor(tokenizer(text, add_special_tokens=False).input_ids, dtype=torch.int64)
    layout = context_bytes(token_bytes(tokenizer), ids)
    units = document_units(layout)

    def spelled(a: int, b: int) -> str:
        return layout.data[layout.starts[a]: layout.starts[b]].tobytes().decode(errors="replace")

    if units.heads is None:  # no table
        return []
    bounds = units.bounds.tolist()
    return [(spelled(a, b), spelled(*head)) for a, b, head in zip(bounds, bounds[1:], units.heads.tolist())
            if head[0] >= 0]


CSV = "The export:\nname,team,calls\nalpha,ml,1203\nbravo,web,2291\ncharlie,ml,3310\n\nThat is all.\n"


def test_csv_rows_get_their_header_and_the_header_itself(tokenizer):
    header = "name,team,calls\n"
    assert headed(tokenizer, CSV) == [(header, header), ("alpha,ml,1203\n", header), ("bravo,web,2291\n", header),
                                      ("charlie,ml,3310\n\n", header)]


def test_markdown_header_is_the_header_row_and_its_separator(tokenizer):
    text = ("# Hosts\n\n| host | role | mem_kb |\n|---|:--:|---:|\n| web-1 | web | 4096 |\n| db-1 | db | 8192 |\n"
            "| q-1 | queue | 2048 |\nAfter the table.\n")
    header = "| host | role | mem_kb |\n|---|:--:|---:|\n"
    got = headed(tokenizer, text)
    assert [row for row, head in got if head == header] == ["| host | role | mem_kb |\n", "|---|:--:|---:|\n",
                                                           "| web-1 | web | 4096 |\n", "| db-1 | db | 8192 |\n",
                                                           "| q-1 | queue | 2048 |\n"]
    assert len(got) == 5


def test_tsv_and_crlf_lines(tokenizer):
    text = "id\tcity\tcount\r\na1\tOslo\t11\r\nb2\tLima\t22\r\nc3\tRome\t33\r\n"
    header = "id\tcity\tcount\r\n"
    assert headed(tokenizer, text) == [(header, header), ("a1\tOslo\t11\r\n", header), ("b2\tLima\t22\r\n", header),
                                       ("c3\tRome\t33\r\n", header)]


@pytest.mark.parametrize("text", [
    # JSON lines: records, not rows under a header
    '{"id": "a", "n": 1, "k": 2}\n{"id": "b", "n": 3, "k": 4}\n{"id": "c", "n": 5, "k": 6}\n{"id": "d", "n": 7, "k": 8}\n',
    # indented code with commas
    "def f(a, b, c):\n    g(a, b, c)\n    h(1, 2, 3)\n    k(4, 5, 6)\n    m(7, 8, 9)\n",
    # two rows under the header: too few for a table
    "name,team,calls\nalpha,ml,1203\nbravo,web,2291\n",
    # a first line of numbers is a row, not a header
    "1,2,3\n4,5,6\n7,8,9\n10,11,12\n",
    # prose with commas
    "Yes, he said, and left.\nNo, she said, and stayed.\nWell, they said, and went.\nSo, we said, and sat.\n",
])
def test_what_is_not_a_table(tokenizer, text):
    assert headed(tokenizer, text) == []


def test_a_header_over_the_cap_is_left_out_and_a_long_row_is_one_unit(tokenizer):
    wide = ",".join(f"column_name_{i}" for i in range(40)) + "\n"  # well over 96 tokens
    rows = "".join(",".join(str(1000 + 7 * i + r) for i in range(40)) + "\n" for r in range(4))
    assert headed(tokenizer, wide + rows) == []
    row = "alpha," + ",".join(str(1234567 + i) for i in range(12)) + "\n"  # ~90 tokens, over 48: one unit still
    text = "name," + ",".join(f"f{i}" for i in range(12)).replace("f", "field_") + "\n" + row * 4
    assert [unit for unit, _ in headed(tokenizer, text)][1:] == [row] * 4


def test_a_million_token_table_is_fast(tokenizer):
    line = "alpha-bravo,ml,team,eu-west-1,1234567,7654321\n"
    ids = torch.tensor(tokenizer("name,team,plan,region,calls,users\n" + line, add_special_tokens=False).input_ids)
    head, row = ids[:12], ids[12:]
    ids = torch.cat((head, row.repeat(1_000_000 // row.numel())))
    layout = context_bytes(token_bytes(tokenizer), ids)
    start = time.perf_counter()
    units = document_units(layout)
    assert time.perf_counter() - start < 2.0
    assert int((units.heads[:, 0] >= 0).sum()) == units.bounds.numel() - 1


def test_a_row_never_joins_a_chat_marker(tokenizer):
    text = ("name,team,calls\nalpha,ml,1203\nbravo,web,2291\ncharlie,ml,3310\ndelta,ml,44<|im_end|>\n"
            "<|im_start|>user\necho,ml,55\n")
    ids = torch.tensor(tokenizer(text, add_special_tokens=False).input_ids, dtype=torch.int64)
    layout = context_bytes(token_bytes(tokenizer), ids)
    assert layout.special.sum() == 2
    units = document_units(layout)
    assert int((units.heads[:, 0] >= 0).sum()) >= 4  # a table: the marker's line is one of its rows
    bounds = units.bounds.tolist()
    for marker in torch.nonzero(torch.from_numpy(layout.special)).squeeze(1).tolist():
        assert marker in bounds and marker + 1 in bounds  # each marker a unit of its own


def test_quoted_fields_keep_their_commas(tokenizer):
    text = ('name,city,amount\n"Smith, John",Oslo,1203\n"Doe, Jane","Lima, Peru",2291\nplain,Rome,3310\n'
            '"Said ""hi"", left",Bern,44\n')
    header = "name,city,amount\n"
    assert headed(tokenizer, text) == [(header, header), ('"Smith, John",Oslo,1203\n', header),
                                       ('"Doe, Jane","Lima, Peru",2291\n', header), ("plain,Rome,3310\n", header),
                                       ('"Said ""hi"", left",Bern,44\n', header)]


@pytest.mark.parametrize("text", ["", "a", "\n", ",,\n,,\n,,\n,,\n", '"\n"\n"\n"', "|\n|---|\n|\n|\n|"])
def test_texts_too_small_or_odd_have_no_table_and_do_not_fail(text):
    import numpy as np

    from ilre.compressor.table_headers import find_tables

    assert find_tables(np.frombuffer(text.encode(), dtype=np.uint8)).first.size == 0
