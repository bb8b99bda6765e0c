"""Context lengths as the evaluation writes them: '4K' / '128k' / '4096' in, '4K' out (K = 1024 tokens)."""

from __future__ import annotations


def parse_length(text: str) -> int:
    """'4K' / '128k' / '4096' -> tokens (K = 1024)."""
    text = text.strip().lower()
    try:
        return int(float(text[:-1]) * 1024) if text.endswith("k") else int(text)
    except ValueError:
        raise ValueError(f"lengths: cannot read {text!r} (examples: 4K, 16k, 8192)") from None


def length_label(length: int) -> str:
    """Tokens -> '4K' where a whole number of K, else the number."""
    return f"{length // 1024}K" if length % 1024 == 0 else str(length)
