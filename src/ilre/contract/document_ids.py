"""The shape of a document id (a result's `document_id`), importable without torch (a thin client checks it)."""

DOCUMENT_ID_CHARS = 32  # hex digits of the keyed digest (engine/document_names.py)
HASH_CHARS = 24  # a document id's first hex digits name the document too: the gateway's retrieve hash
MIN_SECRET_CHARS = 32   # a configured document secret (ILRE_DOCUMENT_SECRET) is at least this long


def is_hex(value: str) -> bool:
    """True when `value` is lowercase hex digits only."""
    return all(c in "0123456789abcdef" for c in value)


def is_document_id(value: str) -> bool:
    """True when `value` has the shape of a document id (32 lowercase hex digits) or of its first 24
    (the hash /v1/retrieve takes)."""
    return len(value) in (DOCUMENT_ID_CHARS, HASH_CHARS) and is_hex(value)


def retrieve_hash(document_id: str) -> str:
    """The short name of a document (its id's first HASH_CHARS hex digits), as gateway markers carry it."""
    return document_id[:HASH_CHARS]
