"""Where a plain prompt's context ends and its query begins, in the tokens the engine would see: the
last `query_tokens` tokens are the query (the ILRe paper's LongBench rule), everything before is
context. A text prompt is tokenized as the engines do (special tokens added, e.g. BOS); those leading
special tokens are kept outside the compression. (Conversations are read message by message:
contract/conversation.py, service/transport/chat_compression.py.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Split:
    """prefix (kept as is) + context (compressed) + query (kept) = the prompt's token IDs."""

    prefix: list[int]
    context: list[int]
    query: list[int]

    @property
    def total(self) -> int:
        return len(self.prefix) + len(self.context) + len(self.query)


class PromptSplitter:
    """Tokenizes prompts with the compressor's tokenizer and splits them into prefix/context/query."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._added = list(tokenizer("", add_special_tokens=True).input_ids)  # e.g. [BOS] or []

    def text_ids(self, text: str) -> list[int]:
        """A text prompt's IDs as an engine tokenizes it (special tokens added)."""
        return list(self.tokenizer(text, add_special_tokens=True).input_ids)

    def plain(self, ids: list[int], query_tokens: int, from_text: bool) -> Split:
        """Split a plain prompt: leading added special tokens | context | last `query_tokens`."""
        n_prefix = len(self._added) if from_text and self._added and ids[:len(self._added)] == self._added else 0
        body = ids[n_prefix:]
        n_query = min(query_tokens, len(body))
        return Split(ids[:n_prefix], body[:len(body) - n_query], body[len(body) - n_query:])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)
