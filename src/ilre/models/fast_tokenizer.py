"""The embedded model's tokenizer on the `tokenizers` library directly.

transformers' generic fast tokenizer is a wrapper around one `tokenizers.Tokenizer` built from tokenizer.json;
loading it through transformers costs ~1.6 s of every process start (its import machinery), reading the file
~0.2 s. For the embedded checkpoint, whose tokenizer.json transformers takes as it is (no added tokens, no
post-processor changes: tests/models/test_fast_tokenizer.py compares both on every path ilre uses), encoding and
decoding run on that Tokenizer here; anything else (chat templates, special-token attributes, saving) is
transformers' own tokenizer, loaded on first use.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Iterable


class Encoded(dict):
    """What a call returns: {"input_ids": [...], "attention_mask": [...]}, the keys also as attributes (as
    transformers' BatchEncoding)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class FastTokenizer:
    """tokenizer(text, add_special_tokens=...) and decode/batch_decode/get_vocab on tokenizer.json's Tokenizer;
    every other call, and calls with options beyond those, on transformers' tokenizer of the same folder."""

    def __init__(self, checkpoint: Path):
        from tokenizers import Tokenizer

        self.checkpoint = Path(checkpoint)
        self._tokenizer = Tokenizer.from_file(str(self.checkpoint / "tokenizer.json"))
        self._full = None
        self._lock = threading.Lock()

    @property
    def full(self):
        """transformers' tokenizer of the checkpoint (loaded once, on first use)."""
        if self._full is None:
            with self._lock:
                if self._full is None:
                    from transformers import PreTrainedTokenizerFast

                    self._full = PreTrainedTokenizerFast.from_pretrained(str(self.checkpoint))
        return self._full

    def __call__(self, text: Any, add_special_tokens: bool = True, **options: Any) -> Encoded:
        """One text -> Encoded(input_ids, attention_mask); lists of texts and other options: transformers'."""
        if options or not isinstance(text, str):
            return self.full(text, add_special_tokens=add_special_tokens, **options)
        ids = self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        return Encoded(input_ids=ids, attention_mask=[1] * len(ids))

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False, **options: Any) -> str:
        """Token IDs (a list, tuple or 1-D tensor) -> text."""
        if options:
            return self.full.decode(ids, skip_special_tokens=skip_special_tokens, **options)
        return self._tokenizer.decode([int(i) for i in _flat(ids)], skip_special_tokens=skip_special_tokens)

    def batch_decode(self, sequences: Iterable[Iterable[int]], skip_special_tokens: bool = False,
                     **options: Any) -> list[str]:
        """Several ID sequences -> their texts."""
        if options:
            return self.full.batch_decode(sequences, skip_special_tokens=skip_special_tokens, **options)
        return self._tokenizer.decode_batch([[int(i) for i in _flat(s)] for s in sequences],
                                            skip_special_tokens=skip_special_tokens)

    def get_vocab(self) -> dict[str, int]:
        """Every token (added ones included) -> its ID."""
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def backend_tokenizer(self):
        """The `tokenizers.Tokenizer` itself (as transformers' fast tokenizers name it)."""
        return self._tokenizer

    @property
    def added_tokens_decoder(self) -> dict:
        """ID -> AddedToken of every added token (its `special` flag included)."""
        return self._tokenizer.get_added_tokens_decoder()

    @property
    def all_special_ids(self) -> list[int]:
        """The IDs of the tokens tokenizer_config.json names special (bos, eos, unk, pad and the extra ones)."""
        config = json.loads((self.checkpoint / "tokenizer_config.json").read_text())
        named = [config.get(f"{kind}_token") for kind in ("bos", "eos", "unk", "pad")]
        named += list(config.get("extra_special_tokens") or config.get("additional_special_tokens") or [])
        tokens = [t["content"] if isinstance(t, dict) else t for t in named if t]
        ids = [self._tokenizer.token_to_id(t) for t in dict.fromkeys(tokens)]
        return [i for i in ids if i is not None]

    def __getattr__(self, name: str) -> Any:  # everything else: transformers' tokenizer
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.full, name)


def _flat(ids: Any) -> Iterable[int]:
    ids = ids.tolist() if hasattr(ids, "tolist") else ids
    return [ids] if isinstance(ids, int) else ids
