"""Passkey samples: deterministic per seed, the needle really is where the span says, right length."""

from __future__ import annotations

import pytest

from ilre.evaluation.tasks.haystack import NOISE, filler_ids
from ilre.evaluation.tasks.passkey import make_passkey_sample


@pytest.fixture(scope="module")
def tokenizer():
    from ilre.models.loader import load_tokenizer, resolve_checkpoint

    return load_tokenizer(resolve_checkpoint(None).path)


@pytest.mark.parametrize("source", ["shakespeare", "noise"])
@pytest.mark.parametrize("depth", [0.0, 0.35, 1.0])
def test_needle_span_holds_the_passkey_phrase(tokenizer, source, depth):
    sample = make_passkey_sample(tokenizer, 3000, depth, digits=12, seed=5, source=source)
    start, end = sample.needle
    phrase = tokenizer.decode(sample.context_ids[start:end])
    assert phrase == f"\n\nThe {sample.key_id} magic passkey is {sample.passkey}.\n"
    assert len(sample.passkey) == 12 and sample.passkey.isdigit()
    assert len(sample.context_ids) == 3000
    assert abs(start - depth * (3000 - (end - start))) <= 1
    assert tokenizer.decode(sample.query_ids).endswith(f"The {sample.key_id} magic passkey is ")


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_distractors_are_other_keys_and_the_needle_span_still_holds(tokenizer, depth):
    sample = make_passkey_sample(tokenizer, 4000, depth, digits=8, seed=3, distractors=3)
    start, end = sample.needle
    assert tokenizer.decode(sample.context_ids[start:end]) == f"\n\nThe {sample.key_id} magic passkey is {sample.passkey}.\n"
    text = tokenizer.decode(sample.context_ids)
    assert text.count(" magic passkey is ") == 4 and text.count(f"The {sample.key_id} magic") == 1
    assert len(sample.context_ids) == 4000
    plain = make_passkey_sample(tokenizer, 4000, depth, digits=8, seed=3)
    assert plain.key_id != sample.key_id or plain.context_ids != sample.context_ids  # its own sample


def test_same_seed_same_sample_other_seed_other_sample(tokenizer):
    a = make_passkey_sample(tokenizer, 2000, 0.5, seed=1)
    b = make_passkey_sample(tokenizer, 2000, 0.5, seed=1)
    c = make_passkey_sample(tokenizer, 2000, 0.5, seed=2)
    assert a == b
    assert (a.passkey, a.context_ids) != (c.passkey, c.context_ids)


def test_filler_sources(tokenizer):
    noise = tokenizer.decode(filler_ids(tokenizer, 200, "noise"))
    assert noise.startswith(NOISE[:40])
    play = tokenizer.decode(filler_ids(tokenizer, 500, "shakespeare", offset=123456))
    assert len(play) > 1000 and play != noise
    with pytest.raises(ValueError, match="source"):
        filler_ids(tokenizer, 10, "wikipedia")
