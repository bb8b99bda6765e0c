"""Retrieval baseline: BM25 over fixed-size token chunks of the context (RAG).

The context is cut into chunks of `chunk` tokens; chunks are ranked by Okapi BM25 against the
query's words; the best chunks are kept until the token budget is spent (the last one cut to
fit), then put back in their original order. Words are lower-cased \\w+ runs.
"""

from __future__ import annotations

import math
import re
from collections import Counter

_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def bm25_scores(docs: list[list[str]], query: list[str], k1: float = 1.5, b: float = 0.75) -> list[float]:
    """Okapi BM25 of each tokenized doc for the query (idf = ln(1 + (N - n + .5) / (n + .5)), never negative)."""
    n_docs = len(docs)
    avg = sum(len(d) for d in docs) / max(n_docs, 1) or 1.0
    df = Counter(w for d in docs for w in set(d))
    terms = Counter(query)
    scores = []
    for doc in docs:
        tf = Counter(doc)
        total = 0.0
        for term, q_count in terms.items():
            if term not in tf:
                continue
            idf = math.log(1 + (n_docs - df[term] + 0.5) / (df[term] + 0.5))
            f = tf[term]
            total += q_count * idf * f * (k1 + 1) / (f + k1 * (1 - b + b * len(doc) / avg))
        scores.append(total)
    return scores


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
