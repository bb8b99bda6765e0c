"""What the sidecar sent for each message of a conversation, for history mode "frozen": a message is
compressed once, the first time it is seen, and every later request that carries it gets the very same
text (service/transport/chat_compression.py). The engine's prefix cache (vLLM's prefix caching,
SGLang's radix cache, llama.cpp's slot reuse) then finds the prompt before the live messages unchanged.

Keys are document ids, which are scoped to the caller's API key (engine/document_names.py), so one key's
texts are never served to another. The map is bounded in bytes, least recently used out first; a text
that has left it is compressed anew the next time, for the question of then.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterator, MutableMapping

ENTRY_BYTES = 160  # a key, a tuple and their references, beside the text itself


class FrozenTexts(MutableMapping[str, tuple[str, int]]):
    """document_id -> (the text sent for it, its tokens), at most `max_bytes` of UTF-8 text and keys."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.bytes = max_bytes, 0
        self._entries: OrderedDict[str, tuple[str, int]] = OrderedDict()

    def __getitem__(self, key: str) -> tuple[str, int]:
        value = self._entries[key]
        self._entries.move_to_end(key)
        return value

    def __setitem__(self, key: str, value: tuple[str, int]) -> None:
        if key in self._entries:
            del self[key]
        size = _size(key, value)
        if size > self.max_bytes:
            return  # larger than the whole map: never frozen
        self._entries[key] = value
        self.bytes += size
        while self.bytes > self.max_bytes:
            del self[next(iter(self._entries))]

    def __delitem__(self, key: str) -> None:
        self.bytes -= _size(key, self._entries.pop(key))

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


def _size(key: str, value: tuple[str, int]) -> int:
    return len(key) + len(value[0].encode()) + ENTRY_BYTES
