"""RULER generator: deterministic per seed, gold answers really in the context, RULER's wording."""

from __future__ import annotations

import re

import pytest

from ilre.evaluation.tasks.lengths import parse_length
from ilre.evaluation.tasks.ruler import TASKS, generate_sample


@pytest.fixture(scope="module")
def tokenizer():
    from ilre.models.loader import load_tokenizer, resolve_checkpoint

    return load_tokenizer(resolve_checkpoint(None).path)


@pytest.mark.parametrize("task", list(TASKS))
def test_gold_answers_are_in_the_tokenized_context_and_length_fits(tokenizer, task):
    sample = generate_sample(tokenizer, task, 4096, seed=3, index=1)
    text = tokenizer.decode(sample.context_ids)
    assert sample.answers and all(a in text for a in sample.answers)
    assert all(a not in sample.query for a in sample.answers)  # the question does not give it away
    total = len(sample.context_ids) + len(sample.query_ids) + TASKS[task].tokens_to_generate
    assert 0.9 * 4096 <= total <= 4096
    assert tokenizer.decode(sample.query_ids) == sample.query


@pytest.mark.parametrize("task", ["niah_single_1", "niah_multikey_3", "vt", "cwe", "fwe"])
def test_same_seed_same_sample_other_seed_other_sample(tokenizer, task):
    a = generate_sample(tokenizer, task, 2048, seed=7)
    b = generate_sample(tokenizer, task, 2048, seed=7)
    c = generate_sample(tokenizer, task, 2048, seed=8)
    assert a == b
    assert (a.answers, a.context_ids) != (c.answers, c.context_ids)


def test_ruler_wording_and_distractors(tokenizer):
    single = generate_sample(tokenizer, "niah_single_2", 2048)
    assert single.context.startswith("A special magic number is hidden within the following text.")
    assert single.question.startswith("\nWhat is the special magic number for ")
    assert single.answer_prefix.endswith("mentioned in the provided text is")
    assert single.answers[0].isdigit() and len(single.answers[0]) == 7
    assert single.context.count("One of the special magic numbers for ") == 1
    multikey = generate_sample(tokenizer, "niah_multikey_1", 2048)
    assert multikey.context.count("One of the special magic numbers for ") == 4  # 3 distractor keys
    needles = generate_sample(tokenizer, "niah_multikey_3", 2048)
    assert needles.context.count("One of the special magic uuids for ") > 10  # a haystack of needles
    assert len(needles.answers[0]) == 36
    multivalue = generate_sample(tokenizer, "niah_multivalue", 2048)
    assert len(multivalue.answers) == 4 and multivalue.answer_prefix.endswith("are")
    multiquery = generate_sample(tokenizer, "niah_multiquery", 2048)
    assert len(multiquery.answers) == 4 and ", and " in multiquery.question
    vt = generate_sample(tokenizer, "vt", 2048)
    assert len(vt.answers) == 5 and all(f"VAR {v} =" in vt.context for v in vt.answers)
    cwe = generate_sample(tokenizer, "cwe", 2048)
    assert len(cwe.answers) == 10
    fwe = generate_sample(tokenizer, "fwe", 2048)
    assert len(fwe.answers) == 3


def test_parse_length():
    assert parse_length("4K") == 4096 and parse_length("128k") == 131072 and parse_length("5000") == 5000
    with pytest.raises(ValueError, match="lengths"):
        parse_length("big")


@pytest.mark.parametrize("index", range(6))
def test_the_paraphrased_needle_shares_no_rare_word_with_the_question(tokenizer, index):
    from ilre.evaluation.tasks import paraphrase

    sample = generate_sample(tokenizer, "niah_paraphrase", 4096, seed=2, index=index)
    assert len(sample.answers) == 1 and sample.answers[0] in sample.context
    found = re.findall(r"The [a-z ]+ keeps a secret code, and that code reads (\d+)\.", sample.context)
    assert found == sample.answers  # one needle, with the gold answer
    needle = paraphrase.needle(next(syn for w, syn in paraphrase.PAIRS if w == sample.details["keys"][0]), found[0])
    assert needle in sample.context
    asked = paraphrase.rare_words(sample.question + sample.answer_prefix)
    assert paraphrase.rare_words(needle) & asked == set(), (needle, asked)
    word = sample.details["keys"][0]
    assert word in asked and any(word == w for w, _ in paraphrase.PAIRS)


def test_no_pair_shares_a_word():
    from ilre.evaluation.tasks.paraphrase import NEEDLE, PAIRS, rare_words

    for word, synonym in PAIRS:
        assert not rare_words(word) & rare_words(synonym), (word, synonym)
        assert not rare_words(word) & rare_words(NEEDLE)
