"""The embedded model's tokenizer on `tokenizers` directly (models/fast_tokenizer.py) against transformers' own
tokenizer of the same folder: the same IDs and texts on every path ilre uses, on text of several kinds."""

from __future__ import annotations

import pytest
import torch

from ilre.evaluation.tasks.haystack import shakespeare_text
from ilre.models.fast_tokenizer import FastTokenizer
from ilre.models.loader import load_tokenizer, resolve_checkpoint
from ilre.models.token_bytes import token_bytes

TEXTS = [
    "",
    "hello world",
    "  leading and trailing spaces \n\n\t tabs\r\nand CRLF  ",
    "<|im_start|>user\nWhat is the vault code?<|im_end|>\n<|im_start|>assistant\n",  # special tokens in the text
    "naïve café — “quotes” ½ × ∑ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 😀👍🏽 中文字符 日本語 한국어 עברית العربية",
    "def f(x):\n    return {'a': [1, 2.5e-3, None]}  # code\n",
    '{"results": [{"job": "job-0001", "rows": 1234567}], "count": 1}',
    "0123456789 " * 40,
]


@pytest.fixture(scope="module")
def both():
    checkpoint = resolve_checkpoint(None).path
    from transformers import PreTrainedTokenizerFast

    return FastTokenizer(checkpoint), PreTrainedTokenizerFast.from_pretrained(str(checkpoint))


def corpus() -> list[str]:
    import pydoc

    return TEXTS + [shakespeare_text()[:20000], pydoc.render_doc(dict, renderer=pydoc.plaintext)[:20000]]


@pytest.mark.parametrize("special", [False, True])
def test_the_same_ids_as_transformers(both, special):
    fast, full = both
    for text in corpus():
        ours = fast(text, add_special_tokens=special)
        theirs = full(text, add_special_tokens=special)
        assert ours.input_ids == theirs.input_ids and ours["attention_mask"] == theirs["attention_mask"], text[:80]


@pytest.mark.parametrize("skip", [False, True])
def test_the_same_texts_as_transformers(both, skip):
    fast, full = both
    for text in corpus():
        ids = full(text).input_ids
        for given in (ids, torch.tensor(ids, dtype=torch.int64)):
            assert fast.decode(given, skip_special_tokens=skip) == full.decode(ids, skip_special_tokens=skip), text[:80]
        pieces = [[i] for i in ids[:300]]
        assert fast.batch_decode(pieces, skip_special_tokens=skip) == full.batch_decode(pieces, skip_special_tokens=skip)
    assert fast.decode(2) == full.decode(2)


def test_vocabulary_and_the_rest_of_the_api_are_transformers(both):
    fast, full = both
    assert fast.get_vocab() == full.get_vocab() and len(fast) == len(full)
    assert sorted(fast.all_special_ids) == sorted(full.all_special_ids)
    assert {i: str(t) for i, t in fast.added_tokens_decoder.items()} == {i: str(t) for i, t in full.added_tokens_decoder.items()}
    assert str(fast.backend_tokenizer.decoder) == str(full.backend_tokenizer.decoder)
    ours, theirs = token_bytes(fast), token_bytes(full)  # the byte table of units and byte offsets
    assert (ours.offsets == theirs.offsets).all() and (ours.data == theirs.data).all() and (ours.special == theirs.special).all()
    assert (fast.eos_token_id, fast.bos_token, fast.chat_template) == (full.eos_token_id, full.bos_token, full.chat_template)
    chat = [{"role": "user", "content": "Hi"}]
    assert fast.apply_chat_template(chat, tokenize=False) == full.apply_chat_template(chat, tokenize=False)
    assert fast("a b", return_offsets_mapping=True)["offset_mapping"] == full("a b", return_offsets_mapping=True)["offset_mapping"]
    assert fast(["a", "b c"]).input_ids == full(["a", "b c"]).input_ids


def test_the_engine_loads_it_without_transformers_tokenizer():
    tokenizer = load_tokenizer(resolve_checkpoint(None).path)
    assert isinstance(tokenizer, FastTokenizer)
    assert tokenizer("The vault code is 4471.").input_ids and tokenizer._full is None  # nothing asked beyond it
