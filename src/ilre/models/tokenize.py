"""Tokenizing a long text in pieces, with the IDs of tokenizing it whole.

A byte-level BPE tokenizer (GPT-2's pre-tokenizer, as Llama 3, Qwen and SmolLM use) first splits
the text into pre-tokens, then merges bytes inside each one. A single space between two
non-space characters always starts a pre-token (" word", " 42", " ."), and nothing before it
reaches past it, so cutting the text right before such a space changes no pre-token and no ID.
Pieces of about `piece_chars` characters are cut there, so a document of millions of tokens never
goes through the tokenizer whole (which holds offsets and several int arrays per token) and its
IDs accumulate in compact int64 blocks instead of a Python list. Tests check the equality.
"""

from __future__ import annotations

from typing import Any

import torch

PIECE_CHARS = 1 << 18  # ~60K tokens of English per tokenizer call


def safe_cut(text: str, before: int) -> int | None:
    """The largest i <= before with text[i] == " " between two non-space characters, or None."""
    i = text.rfind(" ", 1, before + 1)
    while i > 0:
        if i + 1 < len(text) and not text[i - 1].isspace() and not text[i + 1].isspace():
            return i
        i = text.rfind(" ", 1, i)
    return None


class TooManyTokens(ValueError):
    """The text has `count` tokens, more than `limit`."""

    def __init__(self, count: int, limit: int):
        super().__init__(f"{count} tokens exceed the limit of {limit}")
        self.count, self.limit = count, limit


class IncrementalTokenizer:
    """Feed text in any pieces; `finish()` -> (T,) int64 IDs equal to tokenizing the whole text.

    limit: past this many IDs nothing more is kept (only counted), and `finish()` raises
    TooManyTokens with the whole text's count.
    """

    def __init__(self, tokenizer: Any, piece_chars: int = PIECE_CHARS, limit: int | None = None):
        self.tokenizer, self.piece_chars, self.limit = tokenizer, piece_chars, limit
        self._pending: list[str] = []
        self._pending_chars = 0
        self._blocks: list[torch.Tensor] = []
        self.count = 0

    def feed(self, text: str) -> None:
        self._pending.append(text)
        self._pending_chars += len(text)
        if self._pending_chars >= 2 * self.piece_chars:
            pending = "".join(self._pending)
            start = 0
            while len(pending) - start >= 2 * self.piece_chars:
                cut = safe_cut(pending, start + self.piece_chars)
                if cut is None or cut <= start:  # no safe cut in reach: wait for more text
                    cut = safe_cut(pending, len(pending) - 2)
                    if cut is None or cut <= start:
                        break
                self._encode(pending[start:cut])
                start = cut
            self._pending, self._pending_chars = [pending[start:]], len(pending) - start

    def finish(self) -> torch.Tensor:
        """All IDs so far, the rest of the text included."""
        self._encode("".join(self._pending))
        self._pending, self._pending_chars = [], 0
        if self.limit is not None and self.count > self.limit:
            raise TooManyTokens(self.count, self.limit)
        if not self._blocks:
            return torch.empty(0, dtype=torch.int64)
        ids = torch.cat(self._blocks) if len(self._blocks) > 1 else self._blocks[0]
        self._blocks = [ids]
        return ids

    def _encode(self, text: str) -> None:
        if not text:
            return
        ids = torch.tensor(self.tokenizer(text, add_special_tokens=False).input_ids, dtype=torch.int64)
        self.count += ids.numel()
        if self.limit is not None and self.count > self.limit:
            self._blocks = []  # over the limit: only the count goes on
            return
        self._blocks.append(ids)


def tokenize_text(tokenizer: Any, text: str, limit: int | None = None) -> torch.Tensor:
    """(T,) int64 IDs of `text`, tokenized in pieces (see the module docstring)."""
    pieces = IncrementalTokenizer(tokenizer, limit=limit)
    pieces.feed(text)
    return pieces.finish()
