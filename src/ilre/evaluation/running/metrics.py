"""RULER's scoring (scripts/eval/synthetic/constants.py) and the retention metric.

string_match_all: per sample, the share of references found (case-insensitive substring) in the
prediction; string_match_part (RULER's QA metric): 1 if any reference is found. Both return the
mean over samples x 100, rounded to 2 decimals, as RULER prints them. Retention asks the same
question of the compressed context instead of a generation: the share of gold answers whose text
survives compression. Two measures of units (compressor/units.py): the share of the units a selection
touches that it keeps whole, and a reader's prompt with a separator between runs of kept tokens.
"""

from __future__ import annotations

import re

import torch

_NON_PRINTABLE = re.compile(r"[\x00-\x1f]")


def postprocess_pred(text: str) -> str:
    """RULER's cleanup of a generation: strip, control characters -> newlines."""
    return _NON_PRINTABLE.sub("\n", text.strip()).strip()


def match_all(pred: str, refs: list[str]) -> float:
    """One sample of string_match_all: the share of refs contained in pred, in [0, 1]."""
    pred = pred.lower()
    return sum(1.0 for r in refs if r.lower() in pred) / len(refs)


def match_part(pred: str, refs: list[str]) -> float:
    """One sample of string_match_part: 1.0 if any ref is contained in pred."""
    pred = pred.lower()
    return max(1.0 if r.lower() in pred else 0.0 for r in refs)


def string_match_all(preds: list[str], refs: list[list[str]]) -> float:
    return round(sum(match_all(p, r) for p, r in zip(preds, refs)) / len(preds) * 100, 2)


def string_match_part(preds: list[str], refs: list[list[str]]) -> float:
    return round(sum(match_part(p, r) for p, r in zip(preds, refs)) / len(preds) * 100, 2)


METRICS = {"all": match_all, "part": match_part}


def score(pred: str, refs: list[str], metric: str = "all") -> float:
    """One generation scored with the task's RULER metric ("all" or "part"), in [0, 1]."""
    return METRICS[metric](postprocess_pred(pred), refs)


def retention(compressed_context: str, answers: list[str]) -> float:
    """The share of gold answers whose exact text survives in the compressed context, in [0, 1]."""
    return sum(1.0 for a in answers if a in compressed_context) / len(answers)


def separated(kept: list[int], context_ids: list[int], separator: list[int]) -> list[int]:
    """The kept tokens' IDs with `separator` between two kept tokens that are not adjacent in the context."""
    out: list[int] = []
    for k, i in enumerate(kept):
        if k and i != kept[k - 1] + 1:
            out += separator
        out.append(context_ids[i])
    return out


def headed_share(heads: torch.Tensor | None, bounds: torch.Tensor, kept: list[int], sink: int) -> float | None:
    """Of the table rows (units with a header that lie outside it, heads (U, 2), bounds (U+1,)) kept
    whole beyond the first `sink` tokens, the share whose whole header is kept too; None when none is."""
    if heads is None or not kept:
        return None
    length = int(bounds[-1])
    mask = torch.zeros(length + 1, dtype=torch.int64)
    mask[torch.tensor(kept, dtype=torch.int64)] = 1
    total = torch.cat((torch.zeros(1, dtype=torch.int64), torch.cumsum(mask, 0)))
    starts, ends = bounds[:-1], bounds[1:]
    rows = (heads[:, 0] >= 0) & ((starts < heads[:, 0]) | (starts >= heads[:, 1])) & (starts >= sink)
    rows &= total[ends] - total[starts] == ends - starts
    if not bool(rows.any()):
        return None
    head_begin, head_end = heads[rows, 0], heads[rows, 1]
    return round(float((total[head_end] - total[head_begin] == head_end - head_begin).float().mean()), 4)


def whole_share(bounds: torch.Tensor, kept: list[int], sink: int) -> float:
    """Of the units (bounds (U+1,), cut at the sink as unit selection cuts them) that the kept indices touch
    beyond the first `sink` tokens, the share kept whole."""
    length = int(bounds[-1])
    sink = min(sink, length)
    bounds = torch.unique(torch.cat((bounds.clamp(sink, length), torch.tensor([sink, length]))))
    mask = torch.zeros(length, dtype=torch.int64)
    mask[torch.tensor(kept, dtype=torch.int64)] = 1
    sizes = torch.diff(bounds)
    counts = torch.zeros(sizes.numel(), dtype=torch.int64).index_add_(
        0, torch.repeat_interleave(torch.arange(sizes.numel()), sizes), mask[sink:])
    touched = counts > 0
    return round(float((counts[touched] == sizes[touched]).float().mean()), 4) if bool(touched.any()) else 1.0
