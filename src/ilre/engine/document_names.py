"""Document ids that name a cached document for one caller only.

A result's `document_id` is a keyed digest: HMAC-SHA-256, under the service's document secret, of
the caller's document scope, the model name and the token IDs, cut to 32 hex digits. Knowing a
text is not enough to compute its id (the secret is the service's), and two scopes that send the
same text get two ids.

The cache holds a document under its slot, HMAC(secret, scope, id), never under the id itself. A
lookup derives the slot from the scope of the caller and the id it sent, so an id issued to another
scope lands on a slot that nobody holds: the same misses, in the same order and on the same tiers,
as an id never issued. Nothing is shared between scopes under the hood either (a scope that sends a
text another scope sent gets its own entry and prefill): a shared entry would make a fast answer the
sign that someone else sent the text.

Scopes are strings chosen by the service: "" when API keys are off (every caller one scope, as
without keys), "key:<name>" for a key, "share:<group>" for keys that share their documents.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import torch

from ..contract.document_ids import DOCUMENT_ID_CHARS, HASH_CHARS

SECRET_BYTES = 32  # of randomness in a generated secret (written as 64 hex digits)


class DocumentNames:
    """Ids and cache slots under one secret: the UTF-8 bytes of a configured or stored secret
    (None = a new random one, `new_secret()`)."""

    def __init__(self, secret: bytes | None = None):
        self.secret = secret if secret is not None else new_secret().encode()

    def document_id(self, scope: str, model: str, ids: torch.Tensor) -> str:
        """The id a caller in `scope` gets for the (L,) token IDs `ids` of `model` (32 hex digits)."""
        mac = hmac.new(self.secret, _field(b"id") + _field(scope.encode()) + _field(model.encode()), hashlib.sha256)
        mac.update(ids.to(torch.int64).cpu().contiguous().numpy().astype("<i8").tobytes())
        return mac.hexdigest()[:DOCUMENT_ID_CHARS]

    def slot(self, scope: str, document_id: str) -> str:
        """Where the cache holds the document `document_id` of `scope` (32 hex digits): the same
        computation for every id, issued to this scope, to another one, or never. Only the id's first
        HASH_CHARS digits count, so the id and its retrieve hash name one document."""
        message = _field(b"slot") + _field(scope.encode()) + document_id[:HASH_CHARS].encode()
        return hmac.new(self.secret, message, hashlib.sha256).hexdigest()[:DOCUMENT_ID_CHARS]

    def prefix_slots(self, scope: str, model: str, ids: torch.Tensor, ends: list[int]) -> list[str]:
        """The slots the first `end` tokens of `ids` would have as a document of `scope`, for each of `ends`
        (ascending): `slot(scope, document_id(scope, model, ids[:end]))`, the digest taken on token by token
        (one pass over the IDs, however many ends)."""
        mac = hmac.new(self.secret, _field(b"id") + _field(scope.encode()) + _field(model.encode()), hashlib.sha256)
        raw = ids.to(torch.int64).cpu().contiguous().numpy().astype("<i8")
        slots, done = [], 0
        for end in ends:
            mac.update(raw[done:end].tobytes())
            done = end
            slots.append(self.slot(scope, mac.copy().hexdigest()[:DOCUMENT_ID_CHARS]))
        return slots

    def owner(self, scope: str) -> str:
        """The tag the document cache counts `scope`'s documents under (its share of each tier): 16 hex digits, the
        same for every document of the scope, telling nothing of the scope's name (it is stored on Redis)."""
        return hmac.new(self.secret, _field(b"owner") + _field(scope.encode()), hashlib.sha256).hexdigest()[:16]

    def fingerprint(self) -> str:
        """8 hex digits that tell two secrets apart in logs, without revealing either."""
        return hashlib.sha256(b"ilre-document-secret\0" + self.secret).hexdigest()[:8]


def new_secret() -> str:
    """A random document secret: 64 hex digits."""
    return secrets.token_hex(SECRET_BYTES)


def _field(value: bytes) -> bytes:
    """A length-prefixed field, so that no two (scope, model) pairs spell the same message."""
    return len(value).to_bytes(4, "big") + value
