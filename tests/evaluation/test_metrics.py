"""RULER's string_match_all / string_match_part and retention on known cases."""

from __future__ import annotations

from ilre.evaluation.running.baselines import bm25_scores, rag_select, words
from ilre.evaluation.running.metrics import retention, score, string_match_all, string_match_part


def test_string_match_all_and_part_as_ruler_defines_them():
    preds = ["The numbers are 1234567 and 7654321.", "only 1234567", "nothing"]
    refs = [["1234567", "7654321"], ["1234567", "7654321"], ["1234567"]]
    assert string_match_all(preds, refs) == round((1 + 0.5 + 0) / 3 * 100, 2)
    assert string_match_part(preds, refs) == round((1 + 1 + 0) / 3 * 100, 2)
    assert score("  ABC-def\x01", ["abc-DEF"]) == 1.0  # case-insensitive, control characters cleaned


def test_retention_counts_a_retained_needle_and_a_dropped_one():
    needle = "One of the special magic numbers for calm-river is: 4821937."
    kept = f"The grass is green. {needle} The sky is blue."
    assert retention(kept, ["4821937"]) == 1.0
    assert retention("The grass is green. One of the special magic numbers for calm-river is: 48219", ["4821937"]) == 0.0
    assert retention(kept, ["4821937", "1111111"]) == 0.5


def okapi_bm25(docs: list[list[str]], query: list[str], k1: float = 1.5, b: float = 0.75) -> list[float]:
    """The literal Okapi formula, idf = ln(1 + (N - n + .5) / (n + .5)), one query term at a time."""
    import math

    avg = sum(len(d) for d in docs) / len(docs)
    scores = []
    for doc in docs:
        total = 0.0
        for term in query:
            n = sum(term in d for d in docs)
            f = doc.count(term)
            if f:
                idf = math.log(1 + (len(docs) - n + 0.5) / (n + 0.5))
                total += idf * f * (k1 + 1) / (f + k1 * (1 - b + b * len(doc) / avg))
        scores.append(total)
    return scores


def test_bm25_is_okapi_up_to_the_constant_factor():
    import random

    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(40)]
    docs = [[rng.choice(vocab) for _ in range(rng.randint(5, 60))] for _ in range(30)]
    for trial in range(5):
        query = [rng.choice(vocab) for _ in range(rng.randint(1, 6))]
        ours, literal = bm25_scores(docs, query), okapi_bm25(docs, query)
        for got, want in zip(ours, literal):
            assert abs(got * 2.5 - want) < 1e-4 * max(1.0, want)


def test_bm25_ranks_the_chunk_with_the_query_terms_first():
    docs = [words("the grass is green the sky is blue")] * 3 + [words("the magic number for calm-river is 42")]
    scores = bm25_scores(docs, words("What is the magic number for calm-river?"))
    assert max(range(4), key=scores.__getitem__) == 3


class _CharTokenizer:
    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_rag_keeps_best_chunks_within_budget_in_order():
    text = "a" * 8 + "bb key cc" + "d" * 7 + "e" * 8
    ids = [ord(c) for c in text]
    kept = rag_select(_CharTokenizer(), ids, "key", budget=8, chunk=8)
    assert kept == sorted(kept) and len(kept) == 8
    assert "key" in "".join(text[i] for i in kept)


def test_separated_puts_the_separator_between_runs_that_are_not_adjacent():
    from ilre.evaluation.running.metrics import separated

    assert separated([0, 1, 2, 5, 6, 9], list(range(10, 20)), [198]) == [10, 11, 12, 198, 15, 16, 198, 19]
    assert separated([3, 4], list(range(10)), [198]) == [3, 4]


def test_whole_share_counts_the_touched_units_kept_whole_beyond_the_sink():
    import torch

    from ilre.evaluation.running.metrics import whole_share

    bounds = torch.tensor([0, 10, 20, 30])
    assert whole_share(bounds, [0, 1, 2, 3, *range(4, 10), 15], 4) == 0.5  # [4, 10) whole, [10, 20) touched once
    assert whole_share(bounds, [0, 1, 2, 3], 4) == 1.0  # the sink alone touches nothing
    assert whole_share(bounds, list(range(30)), 4) == 1.0


def test_headed_share_counts_the_whole_rows_kept_with_their_header():
    import torch

    from ilre.evaluation.running.metrics import headed_share

    bounds = torch.tensor([0, 4, 10, 20, 30, 40])  # units; [10, 20) a header over the rows [20, 30), [30, 40)
    heads = torch.tensor([[-1, -1], [-1, -1], [10, 20], [10, 20], [10, 20]])
    assert headed_share(heads, bounds, [*range(4), *range(20, 30)], 4) == 0.0  # a whole row, no header
    assert headed_share(heads, bounds, [*range(4), *range(10, 30), *range(30, 35)], 4) == 1.0  # the cut row not counted
    assert headed_share(heads, bounds, [*range(4), *range(12, 40)], 4) == 0.0  # a header cut short is not kept
    assert headed_share(heads, bounds, [*range(4), *range(4, 10)], 4) is None  # no row kept
    assert headed_share(None, bounds, list(range(40)), 4) is None  # no tables looked for
