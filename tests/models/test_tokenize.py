"""Tokenizing in pieces gives the IDs of tokenizing the whole text (the embedded model's tokenizer)."""

from __future__ import annotations

import random
from functools import lru_cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ilre.evaluation.tasks.haystack import shakespeare_text
from ilre.models.loader import load_tokenizer, resolve_checkpoint
from ilre.models.tokenize import IncrementalTokenizer, TooManyTokens, safe_cut, tokenize_text


@lru_cache(maxsize=None)
def tokenizer():
    return load_tokenizer(resolve_checkpoint(None).path)


def whole(text: str) -> list[int]:
    return tokenizer()(text, add_special_tokens=False).input_ids


def fed_in_random_pieces(text: str, piece_chars: int, seed: int) -> list[int]:
    """IDs of `text` fed to an IncrementalTokenizer in random slices of up to 4 pieces."""
    pieces = IncrementalTokenizer(tokenizer(), piece_chars=piece_chars)
    rng, at = random.Random(seed), 0
    while at < len(text):
        step = rng.randint(1, 4 * piece_chars)
        pieces.feed(text[at:at + step])
        at += step
    return pieces.finish().tolist()


@pytest.mark.parametrize("piece_chars", [7, 64, 1000, 20000])
def test_shakespeare_fed_in_random_pieces(piece_chars):
    text = shakespeare_text()[:120_000]
    assert fed_in_random_pieces(text, piece_chars, seed=piece_chars) == whole(text)


def test_long_text_is_tokenized_in_several_calls():
    text = shakespeare_text()[:1_200_000]  # > 2 pieces of the default size
    calls = []
    real = tokenizer()

    def counting(piece, **kwargs):
        calls.append(len(piece))
        return real(piece, **kwargs)

    assert tokenize_text(counting, text).tolist() == whole(text)
    assert len(calls) >= 3 and max(calls) < len(text) // 2


ALPHABET = st.sampled_from(list("ab Z9 .,'\n\t  é漢🙂") + [" 's", "  ", "\n\n", " 12", "'re"])


@settings(max_examples=150, deadline=None)
@given(st.lists(ALPHABET, min_size=0, max_size=300), st.integers(1, 40), st.integers(0, 2**31))
def test_random_texts_in_random_pieces(parts, piece_chars, seed):
    text = "".join(parts)
    assert fed_in_random_pieces(text, piece_chars, seed) == whole(text)


def test_safe_cut_is_a_space_between_non_spaces():
    assert safe_cut("ab cd ef", 7) == 5
    assert safe_cut("ab  cd", 5) is None  # a run of spaces is never cut
    assert safe_cut("abcdef", 5) is None


def test_over_the_limit_only_the_count_goes_on():
    text = shakespeare_text()[:5000]
    pieces = IncrementalTokenizer(tokenizer(), piece_chars=100, limit=50)
    pieces.feed(text)
    assert not pieces._blocks  # nothing kept past the limit
    with pytest.raises(TooManyTokens, match=f"{len(whole(text))} tokens exceed the limit of 50"):
        pieces.finish()
