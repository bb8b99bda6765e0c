"""The bytes each token ID stands for, so a context given as IDs can be read as text without decoding it.

One table per tokenizer (built once, kept): every vocabulary entry's UTF-8 bytes, as a byte-level BPE
(GPT-2, Llama 3, Qwen, SmolLM) or a SentencePiece vocabulary (`▁` for a space, `<0xNN>` byte pieces)
spells it, and which IDs are special tokens (chat markers, BOS/EOS). `context_bytes` then lays out a
context's bytes and each token's byte offset with array gathers only, whatever its length.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _byte_level_alphabet() -> dict[str, int]:
    """The printable stand-in of each byte in byte-level BPE vocabularies -> the byte: printable bytes
    stand for themselves, the other 68 are mapped in order onto code points from 256 up."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


@dataclass(frozen=True)
class TokenBytes:
    """offsets: (V+1,) int64 where each entry's bytes start in `data` (uint8); special: (V,) bool."""

    offsets: np.ndarray
    data: np.ndarray
    special: np.ndarray

    @property
    def size(self) -> int:
        return self.special.size


@dataclass(frozen=True)
class ContextBytes:
    """A context as text: data (N,) uint8 bytes; starts (L+1,) int64, token i spans data[starts[i]:starts[i+1]];
    special (L,) bool, the special tokens among them."""

    data: np.ndarray
    starts: np.ndarray
    special: np.ndarray


_TABLES: dict[int, tuple[Any, TokenBytes]] = {}


def token_bytes(tokenizer: Any) -> TokenBytes:
    """The tokenizer's byte table, built on first use (a few hundred ms for a 50K vocabulary)."""
    held = _TABLES.get(id(tokenizer))
    if held is not None and held[0] is tokenizer:
        return held[1]
    table = _build(tokenizer)
    _TABLES[id(tokenizer)] = (tokenizer, table)
    return table


def _build(tokenizer: Any) -> TokenBytes:
    vocab: dict[str, int] = tokenizer.get_vocab()
    size = max(vocab.values(), default=-1) + 1
    pieces: list[bytes] = [b""] * size
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    byte_level = decoder is not None and "ByteLevel" in str(decoder)
    alphabet = _byte_level_alphabet() if byte_level else {}
    special_ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}  # a property that builds a new dict per read
    special_ids |= {i for i, token in added.items() if getattr(token, "special", False)}
    for piece, i in vocab.items():
        if i in special_ids:
            pieces[i] = piece.encode()
        elif byte_level:
            pieces[i] = bytes(alphabet.get(ch, 63) for ch in piece)  # "?" for a character outside the alphabet
        else:
            match = _BYTE_PIECE.match(piece)
            pieces[i] = bytes([int(match.group(1), 16)]) if match else piece.replace("\u2581", " ").encode()
    lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=size)
    offsets = np.zeros(size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    special = np.zeros(size, dtype=bool)
    special[[i for i in special_ids if 0 <= i < size]] = True
    return TokenBytes(offsets, np.frombuffer(b"".join(pieces), dtype=np.uint8), special)


def context_bytes(table: TokenBytes, ids: torch.Tensor) -> ContextBytes:
    """ids: (L,) int64 -> the context's bytes and token offsets (IDs outside the table read as no bytes)."""
    ids_np = ids.cpu().numpy().astype(np.int64, copy=False)
    inside = (ids_np >= 0) & (ids_np < table.size)
    safe = np.where(inside, ids_np, 0)
    first = table.offsets[safe]
    lengths = np.where(inside, table.offsets[safe + 1] - first, 0)
    starts = np.zeros(ids_np.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    # byte j of the context is byte (j - starts[i]) of token i's entry: one gather over all bytes
    source = np.repeat(first - starts[:-1], lengths) + np.arange(starts[-1], dtype=np.int64)
    return ContextBytes(table.data[source], starts, np.where(inside, table.special[safe], False))


def token_holding(starts: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """starts (L+1,) a ContextBytes' token starts; positions (P,) byte positions -> (P,) the token that
    holds each (the last token for a position at the end of the text)."""
    return np.clip(np.searchsorted(starts, positions, "right") - 1, 0, max(starts.size - 2, 0))
