"""The shape of a document id (a result's `document_id`), importable without torch (a thin client checks it)."""

DOCUMENT_ID_CHARS = 32  # hex digits of the keyed digest (engine/document_names.py)
MIN_SECRET_CHARS = 32   # a configured document secret (ILRE_DOCUMENT_SECRET) is at least this long


def is_document_id(value: str) -> bool:
    """True when `value` has the shape of a document id (32 lowercase hex digits)."""
    return len(value) == DOCUMENT_ID_CHARS and all(c in "0123456789abcdef" for c in value)
