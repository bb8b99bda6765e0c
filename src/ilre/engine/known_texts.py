"""Contexts a scope has sent as text before: their document ids by the text's digest, so that a text sent
again (a follow-up question by text, a client that never keeps ids) is not tokenized again while the document
cache still holds its token IDs. Per scope, as every document (document_names.py): one scope's text never
answers for another's."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

KNOWN_TEXTS = 4096  # digests held (~100 bytes each); the least recently sent go first


class KnownTexts:
    """A bounded LRU map from the digest of (scope, text) to the document id the text was given."""

    def __init__(self, capacity: int = KNOWN_TEXTS):
        self.capacity = capacity
        self._ids: OrderedDict[bytes, str] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(scope: str, text: str) -> bytes:
        """The digest a text sent by `scope` is known under (SHA-256 of the scope, then the text's UTF-8)."""
        scoped = scope.encode()
        digest = hashlib.sha256(len(scoped).to_bytes(4, "big") + scoped)
        digest.update(text.encode("utf-8", "surrogatepass"))
        return digest.digest()

    def get(self, key: bytes) -> str | None:
        """The document id the text under `key` was given, or None."""
        with self._lock:
            found = self._ids.get(key)
            if found is not None:
                self._ids.move_to_end(key)
            return found

    def put(self, key: bytes, document_id: str) -> None:
        """Remember that the text under `key` is the document `document_id` (the oldest forgotten past capacity)."""
        with self._lock:
            self._ids[key] = document_id
            self._ids.move_to_end(key)
            while len(self._ids) > self.capacity:
                self._ids.popitem(last=False)
