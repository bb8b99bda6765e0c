"""The passkey retrieval task of ILRe appendix A.1 (also the needle of the tests and benchmarks)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from .haystack import filler_ids

KEY_WORDS = (
    "dog", "cat", "yellow", "red", "blue", "cup", "green", "house", "tree", "bird", "apple", "stone",
    "river", "lamp", "book", "chair", "white", "black", "fish", "cloud", "moon", "star", "road", "door",
)


@dataclass(frozen=True)
class PasskeySample:
    """context_ids/query_ids: token ids; needle: [start, end) of the passkey phrase in the context."""

    context_ids: list[int]
    query_ids: list[int]
    needle: tuple[int, int]
    key_id: str
    passkey: str
    depth: float


def passkey_phrase(rng: random.Random, digits: int) -> tuple[str, str, str, str]:
    """(key id, passkey, needle phrase, query) in the appendix's wording."""
    key_id = "-".join(rng.sample(KEY_WORDS, 3)) + f"-{rng.randrange(100):02d}"
    passkey = f"{rng.randrange(10 ** digits):0{digits}d}"
    needle = f"\n\nThe {key_id} magic passkey is {passkey}.\n"
    query = f"\n\n# What's the {key_id} magic passkey?\n\nThe {key_id} magic passkey is "
    return key_id, passkey, needle, query


def make_passkey_sample(
    tokenizer, length: int, depth: float, digits: int = 6, seed: int = 0, source: str = "shakespeare",
    distractors: int = 0,
) -> PasskeySample:
    """A haystack of about `length` context tokens with one passkey phrase at relative `depth`.

    The needle is tokenized on its own and spliced between filler tokens, so its token span is
    exact. depth in [0, 1): 0 puts it first, k/20 at the start of the k-th of 20 segments.
    distractors: that many other passkey phrases (other key ids and passkeys, multikey-style) at
    random places; the query asks for the needle's key only.
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth: must be within [0, 1] (got {depth})")
    if distractors < 0:
        raise ValueError(f"distractors: must be >= 0 (got {distractors})")
    rng = random.Random(f"{seed}-{length}-{depth}-{digits}" + (f"-{distractors}" if distractors else ""))
    key_id, passkey, needle, query = passkey_phrase(rng, digits)
    needle_ids = tokenizer(needle, add_special_tokens=False).input_ids
    query_ids = tokenizer(query, add_special_tokens=False).input_ids
    others: list[list[int]] = []
    while len(others) < distractors:
        other_key, _, phrase, _ = passkey_phrase(rng, digits)
        if other_key != key_id:
            others.append(tokenizer(phrase, add_special_tokens=False).input_ids)
    n_filler = max(length - len(needle_ids) - sum(map(len, others)), 0)
    filler = filler_ids(tokenizer, n_filler, source, offset=rng.randrange(10**7))
    at = int(round(depth * n_filler))
    phrases = sorted([(at, 0, needle_ids)] + [(rng.randrange(n_filler + 1), 1, ids) for ids in others],
                     key=lambda item: (item[0], item[1]))
    context, cut, start = [], 0, 0
    for position, kind, ids in phrases:
        context += filler[cut:position]
        cut = position
        if kind == 0:
            start = len(context)
        context += ids
    context += filler[cut:]
    return PasskeySample(context, query_ids, (start, start + len(needle_ids)), key_id, passkey, depth)
