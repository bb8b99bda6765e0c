"""Units: a context cut into runs of whole tokens a reader takes in at once (sentences, lines, records).

`unit_bounds` reads the context's bytes (models/token_bytes.py: what each token spells) and returns
the token index where each unit starts. Boundaries, strongest first:

- hard: before and after every special token (chat markers such as <|im_start|>), so a unit never
  spans two chat messages;
- natural: after each line break (log lines, code, CSV and table rows, JSON lines, Markdown headings
  and list items, blank lines between paragraphs); after a sentence end (. ! ? and the ends of other
  scripts: 。！？｡． ।॥ ؟۔ ։ ።) followed by a space and no lowercase letter, except after an
  abbreviation, an initial or a list number (decimals and version numbers have no space after the
  dot and never cut); after each comma between the elements of a JSON array or the members of an
  object (any bracket group {} [] () too long to be a unit: commas inside strings do not count);
- a bracket group (matched {} [] (), strings skipped) of at most `record_tokens` tokens (the service
  uses 192, four times `max_tokens`) is never cut inside: a pretty-printed JSON record, a dict literal
  or a call across lines stays one unit, at any nesting; a group over that cap is cut between its
  members, and only units holding such a group may exceed `max_tokens`;
- finer, only inside a unit longer than `max_tokens`: clause marks (, ; : followed by a space, and
  ，、；：), then equal token windows of at most `max_tokens`;
- a unit of whitespace alone (a blank line, indentation before a cut) joins the unit before it.

A text with no structure (one 50K-token line, minified data, random bytes) degrades to token
windows. Every step is an array operation over the bytes or the boundaries (regular expressions
find sentence ends and abbreviations, one match per sentence); no Python loop runs per token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch

from ..models.token_bytes import ContextBytes, token_holding
from .defaults import HEADER_TOKENS, RECORD_TOKENS, UNIT_TOKENS
from .table_headers import find_tables, table_heads, whole_rows

# names document_units' rule in the document cache
UNITS_VERSION = f"units-v3-max{UNIT_TOKENS}-record{RECORD_TOKENS}-header{HEADER_TOKENS}"


@dataclass(frozen=True)
class Units:
    """A context's units. bounds: (U+1,) int64 unit starts, 0 first and L last (unit u is the tokens
    bounds[u]:bounds[u+1]); heads: (U, 2) int64 the token span of each unit's table header, (-1, -1) for
    none (compressor/table_headers.py), or None when the context has no table (or tables were not looked for)."""

    bounds: torch.Tensor
    heads: torch.Tensor | None = None

    def to_tensors(self) -> dict[str, torch.Tensor]:
        """The tensors a document store keeps ("bounds", and "heads" when known)."""
        return {"bounds": self.bounds} if self.heads is None else {"bounds": self.bounds, "heads": self.heads}

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> "Units":
        return cls(tensors["bounds"], tensors.get("heads"))

_CLOSERS = rb"(?:[\"')\]]|\xe2\x80\x9d|\xe2\x80\x99|\xc2\xbb)"  # " ' ) ] and the typographic ” ’ »
# Latin-script ends need a space and then no lowercase letter; a line break after them cuts anyway
_SENTENCE_END = re.compile(rb"[.!?]+" + _CLOSERS + rb"*(?=[ \t]+(?![a-z ]))")
_OTHER_SCRIPT_ENDS = "。！？｡．।॥؟۔։።"
_SCRIPT_END = re.compile(b"(?:" + b"|".join(re.escape(c.encode()) for c in _OTHER_SCRIPT_ENDS) + b")+" + _CLOSERS + b"*")
_ABBREVIATION = re.compile(
    rb"(?:^|(?<=[\s(\[\"']))(?:Mr|Mrs|Ms|Dr|Prof|Sr|Jr|St|Mt|Gen|Col|Lt|Rev|vs|etc|approx|Inc|Ltd|Co|Corp|No|"
    rb"Fig|Figs|Vol|Eq|Sec|Ch|al|cf|ca|e\.g|i\.e|a\.m|p\.m|[A-Za-z]|\d{1,3})(?=\.)", re.MULTILINE)
_CJK_CLAUSE = re.compile("|".join("，、；：").encode())
_WHITESPACE = np.zeros(256, dtype=bool)
_WHITESPACE[[9, 10, 11, 12, 13, 32]] = True
_OPEN, _CLOSE = np.zeros(256, dtype=bool), np.zeros(256, dtype=bool)
_OPEN[[ord(c) for c in "{[("]] = True
_CLOSE[[ord(c) for c in "}])"]] = True


def _positions(pattern: re.Pattern, data: bytes) -> np.ndarray:
    """Where the pattern's matches end, as int64 byte positions."""
    return np.asarray([m.end() for m in pattern.finditer(data)], dtype=np.int64)


def _inside(points: np.ndarray, opens: np.ndarray, closes: np.ndarray) -> np.ndarray:
    """For nested-or-disjoint groups (open, close]: whether each point lies in one (open < p <= close)."""
    return np.searchsorted(np.sort(opens), points, "left") - np.searchsorted(np.sort(closes), points, "left") > 0


def _outside_strings(data: np.ndarray, points: np.ndarray, newlines: np.ndarray) -> np.ndarray:
    """Whether each byte position is outside a double-quoted string: an even count of unescaped quotes
    before it on its line (a JSON string never holds a raw line break; an unclosed quote in prose ends
    with its line)."""
    quote = data == 34
    quote[2:] &= ~((data[1:-1] == 92) & (data[:-2] != 92))  # \" escapes, \\" does not
    quote[1:2] &= data[0:1] != 92
    quotes = np.flatnonzero(quote)
    line_start = np.concatenate(([0], newlines + 1))[np.searchsorted(newlines, points, "left")]
    return (np.searchsorted(quotes, points, "left") - np.searchsorted(quotes, line_start, "left")) % 2 == 0


def bracket_groups(data: np.ndarray, newlines: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Matched bracket pairs ({ [ ( with } ] ), outside strings) as (open positions, close positions).

    The depth is the running count of opens minus closes, kept >= 0 (a close with nothing open is
    ignored); an open that takes the depth to d pairs with the next close taken at depth d, so pairs
    come from one stable sort by (depth, position), never a stack."""
    events = np.flatnonzero(_OPEN[data] | _CLOSE[data])
    events = events[_outside_strings(data, events, newlines)]
    if events.size == 0:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty
    step = np.where(_OPEN[data[events]], 1, -1)
    raw = np.cumsum(step)
    depth = raw - np.minimum(np.minimum.accumulate(raw), 0)  # reflected at 0
    before = np.concatenate(([0], depth[:-1]))
    level = np.where(step > 0, depth, before)  # an open's depth after it, a close's before it
    keep = level > 0
    events, step, level = events[keep], step[keep], level[keep]
    order = np.lexsort((events, level))
    events, step, level = events[order], step[order], level[order]
    pair = (step[:-1] > 0) & (step[1:] < 0) & (level[:-1] == level[1:])
    return events[:-1][pair], events[1:][pair]


def _token_of(starts: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The first token starting at or after each byte position (a cut inside a token moves past it)."""
    return np.searchsorted(starts, positions, "left")


def _windows(bounds: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """Cuts that split every unit longer than its cap (caps: (U,)) into equal windows of at most the cap."""
    sizes = np.diff(bounds)
    over = np.flatnonzero(sizes > caps)
    if over.size == 0:
        return np.empty(0, dtype=np.int64)
    size = sizes[over]
    pieces = -(-size // caps[over])
    cuts = pieces - 1
    base = np.repeat(bounds[over], cuts)
    size_r, pieces_r = np.repeat(size, cuts), np.repeat(pieces, cuts)
    j = np.arange(cuts.sum()) - np.repeat(np.cumsum(cuts) - cuts, cuts) + 1
    return base + (j * size_r) // pieces_r


def unit_bounds(text: ContextBytes, max_tokens: int, record_tokens: int | None = None) -> torch.Tensor:
    """The context's units: (U+1,) int64 ascending token indices, 0 first and L last; unit u is the
    tokens bounds[u]:bounds[u+1]. max_tokens: the cap on one unit (finer cuts, then windows, beyond it);
    record_tokens: the cap on one bracket group kept whole (a pretty-printed record), max_tokens if None."""
    data, starts = text.data, text.starts
    length = starts.size - 1
    if length <= 0:
        return torch.zeros(1, dtype=torch.int64)
    raw = data.tobytes()
    newlines = np.flatnonzero(data == 10)
    opens, closes = bracket_groups(data, newlines)
    group_tokens = token_holding(starts, closes) - token_holding(starts, opens) + 1
    record_tokens = max(record_tokens or max_tokens, max_tokens)
    small = group_tokens <= record_tokens
    small_opens, small_closes = opens[small], closes[small]

    abbreviations = _positions(_ABBREVIATION, raw)  # the position of the dot after each
    latin = np.asarray([m.span() for m in _SENTENCE_END.finditer(raw)], dtype=np.int64).reshape(-1, 2)
    latin_ends = latin[~np.isin(latin[:, 0], abbreviations), 1]  # (start, end) of each end, one pass
    commas = np.flatnonzero(data == 44)
    commas = commas[_inside(commas, opens, closes) & _outside_strings(data, commas, newlines)]
    natural = np.concatenate((newlines + 1, latin_ends, _positions(_SCRIPT_END, raw), commas + 1))
    natural = natural[~_inside(natural, small_opens, small_closes)]

    special = np.flatnonzero(text.special)
    hard = np.concatenate(([0, length], special, special + 1))
    bounds = np.unique(np.concatenate((hard, _token_of(starts, natural))))

    clause_marks = np.flatnonzero(np.isin(data[:-1], (44, 58, 59)) & _WHITESPACE[data[1:]]) + 1
    clauses = np.concatenate((clause_marks, _positions(_CJK_CLAUSE, raw)))
    clauses = _token_of(starts, clauses[~_inside(clauses, small_opens, small_closes)])
    sizes = np.diff(bounds)
    unit = np.searchsorted(bounds, clauses, "right") - 1
    inner = (unit >= 0) & (unit < sizes.size)
    clauses = clauses[inner][sizes[unit[inner]] > max_tokens]
    bounds = _merge_blank(np.unique(np.concatenate((bounds, clauses))), starts, data, hard)
    caps = np.full(bounds.size - 1, max_tokens, dtype=np.int64)
    records = token_holding(starts, opens[small & (group_tokens > max_tokens)])
    caps[np.searchsorted(bounds, records, "right") - 1] = record_tokens
    return torch.from_numpy(np.unique(np.concatenate((bounds, _windows(bounds, caps)))))


def document_units(text: ContextBytes) -> Units:
    """A document's units as the service cuts them (UNITS_VERSION): the bounds with the default caps, a
    table's rows whole up to the record cap, and the table headers of at most HEADER_TOKENS tokens
    (compressor/table_headers.py)."""
    tables = find_tables(text.data)
    bounds = whole_rows(text, unit_bounds(text, UNIT_TOKENS, RECORD_TOKENS), tables, RECORD_TOKENS)
    return Units(bounds, table_heads(text, bounds, tables, HEADER_TOKENS) if tables.first.size else None)


def _merge_blank(bounds: np.ndarray, starts: np.ndarray, data: np.ndarray, hard: np.ndarray) -> np.ndarray:
    """Drop the start of every unit made of whitespace alone (it joins the unit before it), unless a
    hard boundary (a special token) is there."""
    solid = np.zeros(data.size + 1, dtype=np.int64)
    np.cumsum(~_WHITESPACE[data], out=solid[1:])
    at = solid[starts[bounds]]
    blank = np.zeros(bounds.size, dtype=bool)
    blank[1:-1] = at[2:] == at[1:-1]
    blank &= ~np.isin(bounds, hard)
    return bounds[~blank].astype(np.int64)


def kept_spans(bounds: torch.Tensor, kept: torch.Tensor, text: ContextBytes) -> list[list[int]]:
    """[start, end) character offsets in the context's text of each kept unit (a run of kept tokens
    within one unit: whole units, the trimmed one, the sink), in order. bounds (U+1,), kept (K,) ascending."""
    kept_np = kept.cpu().numpy().astype(np.int64)
    if kept_np.size == 0:
        return []
    unit_starts = np.zeros(text.starts.size, dtype=bool)
    unit_starts[bounds.cpu().numpy()] = True
    first = np.ones(kept_np.size, dtype=bool)
    first[1:] = (np.diff(kept_np) != 1) | unit_starts[kept_np[1:]]
    last = np.ones(kept_np.size, dtype=bool)
    last[:-1] = first[1:]
    chars = np.zeros(text.data.size + 1, dtype=np.int64)  # characters before each byte: UTF-8 lead bytes
    np.cumsum((text.data & 0xC0) != 0x80, out=chars[1:])
    begin = chars[text.starts[kept_np[first]]]
    end = chars[text.starts[kept_np[last] + 1]]
    return np.stack((begin, end), axis=1).tolist()
