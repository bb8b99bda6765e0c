"""Table headers: the line that names a table's columns, for each row that a reader cannot read without it.

A table is a run of consecutive lines of one shape, at least HEADER_ROWS rows under its header:
- Markdown: lines that start with `|` and hold the same number of `|`, the second one a separator
  (`|---|:--:|`); the header is the first line and the separator;
- CSV / TSV: lines with the same number (>= 2) of commas, or of tabs, outside quoted fields ("Smith,
  John"), that do not start with a bracket or whitespace (JSON lines and indented code are not
  tables), whose first line has no field that is a figure while at least half the rows below it have
  one (column names over figures: a table of words alone has no header to tell from its rows).

`find_tables` finds them; `whole_rows` makes each row of at most the record cap one unit (a row is a
record); `table_heads` gives each unit of a context (compressor/units.py) the token span of its table's
header, so that unit selection can keep a row with its header when the header costs at most
`max_tokens`: a row of numbers says nothing without its column names. The header's own units get their header too (keeping
one keeps the whole header). Every step is an array operation over the lines; no Python loop runs per
line or per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..models.token_bytes import ContextBytes, token_holding

HEADER_ROWS = 3  # rows under a header for a run of lines to count as a table
_DIGIT = np.zeros(256, dtype=bool)
_DIGIT[ord("0"):ord("9") + 1] = True
_FIGURE = _DIGIT.copy()  # what a field that is a figure is made of
_FIGURE[[ord(c) for c in "+-.:/% \r"]] = True
_SEPARATOR = np.zeros(256, dtype=bool)  # what a Markdown table's separator line is made of
_SEPARATOR[[ord(c) for c in "|-: \t\r"]] = True
_NOT_A_ROW_START = np.zeros(256, dtype=bool)  # a CSV/TSV row never starts with these
_NOT_A_ROW_START[[ord(c) for c in "{[(' \t#"]] = True


def _per_line(mask: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """How many bytes of each line [start, end) the (N,) mask marks."""
    total = np.zeros(mask.size + 1, dtype=np.int64)
    np.cumsum(mask, out=total[1:])
    return total[ends] - total[starts]


@dataclass(frozen=True)
class Tables:
    """The tables of a text, by line: line_starts / line_ends (lines,) byte spans of every line (the end
    before its line break); first (T,) each table's header line, head (T,) its header's lines (1 or 2),
    last (T,) its last row's line."""

    line_starts: np.ndarray
    line_ends: np.ndarray
    first: np.ndarray
    head: np.ndarray
    last: np.ndarray


def find_tables(data: np.ndarray) -> Tables:
    """The tables (the shapes above) among the lines of `data` (N,) uint8."""
    if data.size == 0:
        none = np.zeros(0, dtype=np.int64)
        return Tables(np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), none, none, none)
    newlines = np.flatnonzero(data == 10)
    line_starts = np.concatenate(([0], newlines + 1))
    line_ends = np.concatenate((newlines, [data.size]))  # exclusive, without the line break
    sizes = line_ends - line_starts
    first = np.where(sizes > 0, data[np.minimum(line_starts, data.size - 1)], 0)
    pipes = _per_line(data == 124, line_starts, line_ends)
    unquoted = _unquoted(data, line_starts)
    commas = _per_line((data == 44) & unquoted, line_starts, line_ends)
    tabs = _per_line((data == 9) & unquoted, line_starts, line_ends)
    markdown = (first == 124) & (pipes >= 3)
    separator = markdown & (_per_line(_SEPARATOR[data], line_starts, line_ends) == sizes)
    plain = ~markdown & ~_NOT_A_ROW_START[first] & (sizes > 0)
    # one shape per line: kind (1 Markdown, 2 CSV, 3 TSV) times a large number plus its delimiter count
    shape = np.where(markdown, (1 << 40) + pipes,
                     np.where(plain & (tabs >= 2), (3 << 40) + tabs,
                              np.where(plain & (commas >= 2), (2 << 40) + commas, 0)))
    change = np.ones(shape.size, dtype=bool)
    change[1:] = shape[1:] != shape[:-1]
    run_first = np.flatnonzero(change)
    run_length = np.diff(np.concatenate((run_first, [shape.size])))
    is_markdown = shape[run_first] >> 40 == 1
    head = np.where(is_markdown, 2, 1)
    second = np.minimum(run_first + 1, shape.size - 1)
    # a CSV/TSV header names its columns: no field of it is a figure, while most rows hold one
    figures = np.where(shape >> 40 == 3, _figure_fields(data, (data == 9) & unquoted, line_starts),
                       _figure_fields(data, (data == 44) & unquoted, line_starts))
    with_figures = np.concatenate(([0], np.cumsum(figures > 0)))
    rows_first = np.minimum(run_first + head, shape.size)
    rows_with = with_figures[run_first + run_length] - with_figures[rows_first]
    table = (shape[run_first] > 0) & (run_length >= head + HEADER_ROWS) & np.where(
        is_markdown, separator[second] & ~separator[run_first],
        (figures[run_first] == 0) & (2 * rows_with >= run_length - head))
    return Tables(line_starts, line_ends, run_first[table], head[table], (run_first + run_length - 1)[table])


def whole_rows(text: ContextBytes, bounds: torch.Tensor, tables: Tables, max_tokens: int) -> torch.Tensor:
    """bounds (U+1,) without the cuts inside a table's lines of at most `max_tokens` tokens: a row is one
    unit, as a record is (a longer row keeps its cuts, and a special token stays a unit of its own)."""
    if tables.first.size == 0:
        return bounds
    count = tables.last - tables.first + 1
    lines = _ranges(tables.first, count)
    begin = token_holding(text.starts, tables.line_starts[lines])
    end = token_holding(text.starts, tables.line_ends[lines])  # the token holding the line break
    short = end - begin + 1 <= max_tokens
    begin, end = begin[short], end[short]
    if begin.size == 0:
        return bounds
    cuts = bounds.cpu().numpy()
    line = np.searchsorted(begin, cuts, "right") - 1  # the last short line starting at or before each cut
    inside = (line >= 0) & (cuts > begin[np.maximum(line, 0)]) & (cuts <= end[np.maximum(line, 0)])
    special = np.flatnonzero(text.special)
    inside &= ~np.isin(cuts, np.concatenate((special, special + 1)))  # never across a chat message
    return torch.from_numpy(cuts[~inside])


def table_heads(text: ContextBytes, bounds: torch.Tensor, tables: Tables, max_tokens: int) -> torch.Tensor:
    """text: the context's bytes; bounds: (U+1,) its unit starts (0 first, L last); tables: its tables
    -> (U, 2) int64: for each unit the token span [start, end) of its table's header, or (-1, -1) when
    it is in no table or the header is longer than `max_tokens` tokens. A header span is a run of whole
    units."""
    units = bounds.numel() - 1
    heads = np.full((max(units, 0), 2), -1, dtype=np.int64)
    if units <= 0 or tables.first.size == 0:
        return torch.from_numpy(heads)
    starts, cuts = text.starts, bounds.cpu().numpy()
    # the header's and the table's token spans, widened to whole units
    head_begin = _unit_of(cuts, token_holding(starts, tables.line_starts[tables.first]))
    head_end = _unit_of(cuts, token_holding(starts, tables.line_ends[tables.first + tables.head - 1])) + 1
    table_end = _unit_of(cuts, token_holding(starts, tables.line_ends[tables.last])) + 1
    span_begin, span_end = cuts[head_begin], cuts[np.minimum(head_end, units)]
    fits = (span_end - span_begin <= max_tokens) & (table_end > head_end)
    head_begin, table_end, span_begin, span_end = head_begin[fits], table_end[fits], span_begin[fits], span_end[fits]
    count = table_end - head_begin
    if count.size == 0:
        return torch.from_numpy(heads)
    unit = _ranges(head_begin, count)
    heads[unit, 0] = np.repeat(span_begin, count)
    heads[unit, 1] = np.repeat(span_end, count)
    return torch.from_numpy(heads)


def _ranges(first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The integers first[i], first[i] + 1, ... (count[i] of them) for every i, concatenated."""
    return np.repeat(first, count) + np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)


def _unquoted(data: np.ndarray, line_starts: np.ndarray) -> np.ndarray:
    """(N,) whether each byte is outside a CSV quoted field: an even count of double quotes before it on its
    line (a doubled quote inside a field counts twice, so it keeps the parity)."""
    before = np.concatenate(([0], np.cumsum(data == 34)))[:-1]
    line = np.concatenate(([0], np.cumsum(data[:-1] == 10)))
    return (before - before[np.minimum(line_starts, data.size - 1)][line]) % 2 == 0


def _figure_fields(data: np.ndarray, delimiters: np.ndarray, line_starts: np.ndarray) -> np.ndarray:
    """Per line, how many of its fields (between the (N,) `delimiters` bytes) are figures: at least one
    digit and nothing but digits, signs, points, colons, slashes, percent signs and spaces (1203, 0.0.1,
    2026-01, 01:25:34)."""
    cuts = np.flatnonzero(delimiters | (data == 10))
    begin = np.concatenate(([0], cuts + 1))
    end = np.concatenate((cuts, [data.size]))
    other = np.concatenate(([0], np.cumsum(~_FIGURE[data])))
    digit = np.concatenate(([0], np.cumsum(_DIGIT[data])))
    figure = (other[end] == other[begin]) & (digit[end] > digit[begin])
    line = np.searchsorted(line_starts, begin, "right") - 1
    return np.bincount(line[figure], minlength=line_starts.size)


def _unit_of(bounds: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """The unit that holds each token."""
    return np.searchsorted(bounds, tokens, "right") - 1
