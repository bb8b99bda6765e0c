"""Where a prompt's context ends and its query begins, in the tokens the engine would see.

- Plain prompts (text or token IDs): the last `query_tokens` tokens are the query (the ILRe paper's
  LongBench rule), everything before is context. A text prompt is tokenized as the engines do
  (special tokens added, e.g. BOS); those leading special tokens are kept outside the compression.
- Chat: the messages are rendered with the model's chat template (generation prompt added) and
  tokenized as one text; the last user turn plus the assistant header is the query, every turn
  before it is context. A last turn longer than MAX_CHAT_QUERY_TOKENS (a document pasted into the
  question) keeps only its last `query_tokens` tokens as the query; the rest joins the context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...engine.chat import last_user_index

MAX_CHAT_QUERY_TOKENS = 1024


@dataclass(frozen=True)
class Split:
    """prefix (kept as is) + context (compressed) + query (kept) = the prompt's token IDs."""

    prefix: list[int]
    context: list[int]
    query: list[int]

    @property
    def total(self) -> int:
        return len(self.prefix) + len(self.context) + len(self.query)


@dataclass(frozen=True)
class ChatSplit(Split):
    """A chat split, with what is needed to put kept tokens back into messages (text forwarding):
    the rendered prompt, each context token's character span in it, each message's content span."""

    rendered: str = ""
    offsets: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), dtype=np.int64))  # (len(context), 2)
    spans: list[tuple[int, int]] = field(default_factory=list)                              # per message
    query_start: int = 0                                                                   # char offset


class ChatTemplateError(ValueError):
    """The messages cannot be rendered with the model's chat template."""


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

    def chat(self, messages: list[dict[str, Any]], query_tokens: int, template_kwargs: dict[str, Any]) -> ChatSplit:
        """Render `messages` (string contents) and split at the last user turn."""
        try:
            rendered = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                          **template_kwargs)
        except Exception as exc:  # jinja errors, templates that refuse a role order, ...
            raise ChatTemplateError(f"messages: the chat template cannot render them ({exc})") from None
        last_user = last_user_index(messages)
        spans = _content_spans(rendered, messages)
        if last_user is None:
            query_start = len(rendered)
        elif spans is not None:  # the last user turn starts where the turn before it ends
            before = messages[:last_user]
            head = (self.tokenizer.apply_chat_template(before, tokenize=False, add_generation_prompt=False,
                                                       **template_kwargs) if before else "")
            query_start = len(head) if head and rendered.startswith(head) else _turn_start(rendered, spans, last_user)
        else:
            query_start = rendered.rfind(messages[last_user]["content"])
        encoded = self.tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(encoded.input_ids)
        offsets = np.asarray(encoded.offset_mapping, dtype=np.int64).reshape(-1, 2)
        n_context = int(np.searchsorted(offsets[:, 0], max(query_start, 0), side="left")) if query_start >= 0 else 0
        if len(ids) - n_context > MAX_CHAT_QUERY_TOKENS:  # a document in the question itself
            n_context = max(len(ids) - query_tokens, 0)
        query_start = int(offsets[n_context, 0]) if n_context < len(ids) else len(rendered)
        return ChatSplit([], ids[:n_context], ids[n_context:], rendered=rendered, offsets=offsets[:n_context],
                         spans=spans or [], query_start=query_start)


def _content_spans(rendered: str, messages: list[dict[str, Any]]) -> list[tuple[int, int]] | None:
    """Each message's content as a (start, end) character span of `rendered`, found in order;
    None when a template changes a content (then messages cannot be rebuilt from kept tokens)."""
    spans, at = [], 0
    for message in messages:
        content = message["content"]
        start = rendered.find(content, at)
        if start < 0:
            return None
        spans.append((start, start + len(content)))
        at = start + len(content)
    return spans


def _turn_start(rendered: str, spans: list[tuple[int, int]], index: int) -> int:
    """Where turn `index` begins: just after the previous message's content and its end marker."""
    if index == 0:
        return 0
    previous_end = spans[index - 1][1]
    newline = rendered.find("\n", previous_end, spans[index][0])
    return newline + 1 if newline >= 0 else spans[index][0]


def rebuild_messages(messages: list[dict[str, Any]], split: ChatSplit, kept: list[int]) -> list[dict[str, Any]]:
    """Messages whose context contents hold only the kept context tokens' text (text forwarding).

    A context token belongs to the message whose content span holds its first character; template
    tokens (role headers, end markers) belong to none and are re-rendered by the engine. The part
    of a message at or after the query start is kept whole.
    """
    kept_offsets = split.offsets[np.asarray(kept, dtype=np.int64)] if kept else np.zeros((0, 2), dtype=np.int64)
    rebuilt = []
    for message, (start, end) in zip(messages, split.spans):
        if start >= split.query_start:
            rebuilt.append(message)
            continue
        inside = kept_offsets[(kept_offsets[:, 0] >= start) & (kept_offsets[:, 0] < min(end, split.query_start))]
        pieces = [split.rendered[max(s, start):min(e, end)] for s, e in inside.tolist()]
        tail = split.rendered[split.query_start:end] if end > split.query_start else ""
        rebuilt.append({**message, "content": "".join(pieces) + tail})
    return rebuilt
