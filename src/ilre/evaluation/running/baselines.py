"""Retrieval baseline: BM25 over fixed-size token chunks of the context (RAG).

The context is cut into chunks of `chunk` tokens; chunks are ranked by Okapi BM25 (bm25s,
Lucene's variant: idf = ln(1 + (N - n + .5) / (n + .5)), k1 = 1.5, b = 0.75) against the query's
words; the best chunks are kept until the token budget is spent (the last one cut to fit), then
put back in their original order. Words are lower-cased \\w+ runs.
"""

from __future__ import annotations

import logging
import re

import bm25s

logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs every index build at DEBUG

_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def bm25_scores(docs: list[list[str]], query: list[str], k1: float = 1.5, b: float = 0.75) -> list[float]:
    """BM25 of each tokenized doc for the query's words (Lucene's form: Okapi's without the constant
    factor k1 + 1, so the ranking is Okapi's; a test checks it against the literal formula)."""
    if not query or not any(docs):
        return [0.0] * len(docs)
    index = bm25s.BM25(method="lucene", k1=k1, b=b)
    index.index([doc or [""] for doc in docs], show_progress=False)
    return index.get_scores(query).tolist()


def rag_select(tokenizer, context_ids: list[int], query: str, budget: int, chunk: int = 256) -> list[int]:
    """Kept context indices (ascending): the BM25-best `chunk`-token chunks within `budget` tokens."""
    if len(context_ids) <= budget:
        return list(range(len(context_ids)))
    bounds = [(s, min(s + chunk, len(context_ids))) for s in range(0, len(context_ids), chunk)]
    docs = [words(tokenizer.decode(context_ids[s:e])) for s, e in bounds]
    scores = bm25_scores(docs, words(query))
    order = sorted(range(len(bounds)), key=lambda i: (-scores[i], i))
    kept: list[int] = []
    for i in order:
        s, e = bounds[i]
        room = budget - len(kept)
        if room <= 0:
            break
        kept.extend(range(s, min(e, s + room)))
    return sorted(kept)
