"""A chat compressed message by message: which messages are context, which is the query, which stay
whole, and each compressed message's share of a token budget. The gateway routes
(service/transport/gateway.py) and the LiteLLM hook (integrations/litellm.py) both follow these rules;
nothing here counts tokens (the callers ask the model) or needs torch.

- A message's text: its content when a string, or its parts joined when every part is text. Any other
  content (an image, audio or file part, null) leaves the message as it came.
- The query: the last user message (the last message whose role is "user", wherever it stands: tool
  results may follow it), read as its text parts. When it is longer than LONG_QUERY tokens (documents
  pasted before a question), its last QUERY_TOKENS tokens are the query.
- Compressed: user messages other than the last, tool and function results; system and developer
  messages longer than LONG_INSTRUCTIONS tokens (a document pasted into the instructions); and the last
  user message when it is longer than LONG_QUERY tokens and text only: its last QUERY_TOKENS tokens
  stay, the rest is compressed.
- Kept whole: assistant messages (and every role but user, tool, function, system and developer);
  system and developer messages of at most LONG_INSTRUCTIONS tokens; the messages up to the last one
  carrying a `cache_control` breakpoint (a provider's prompt cache holds their exact bytes); any
  message of at most QUERY_TOKENS tokens.
- The budget covers the whole chat: what stays whole counts first, and what is left of the budget (at
  least one token each) is shared among the compressed messages in proportion to their tokens. A
  message whose share holds it passes whole, so a chat that fits the budget passes untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .defaults import QUERY_TOKENS

COMPRESSED_ROLES = ("user", "tool", "function")  # the last user message excepted
INSTRUCTION_ROLES = ("system", "developer")  # compressed only when longer than LONG_INSTRUCTIONS tokens
LONG_INSTRUCTIONS = 1024  # instructions longer than this hold documents
LONG_QUERY = 2 * QUERY_TOKENS  # a last user message longer than this is documents followed by their question
SEPARATOR = "\n\n"  # between messages whose tokens are counted together


def message_text(content: Any) -> str | None:
    """A message content's text: a string, or its parts joined when every part is text ([] gives "");
    None for anything else (an image, audio or file part, null)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(_is_text_part(p) for p in content):
        return "".join(p["text"] for p in content)
    return None


def query_text(content: Any) -> str | None:
    """What a message asks: its text, or the text parts of a content that also holds images or files;
    None when it holds no text but whitespace."""
    if isinstance(content, list):
        content = "".join(p["text"] for p in content if _is_text_part(p))
    return content if isinstance(content, str) and content.strip() else None


def last_user_index(messages: Sequence[Any]) -> int | None:
    """The index of the last user message (the live question), or None when no message is a user's; a
    message without content (a non-text piece of a conversation: contract/conversation.py) asks nothing."""
    return max((i for i, m in enumerate(messages) if isinstance(m, Mapping) and m.get("role") == "user"
                and m.get("content") is not None), default=None)


def cached_prefix(messages: Sequence[Any]) -> int:
    """How many leading messages a prompt-cache breakpoint pins: those up to and including the last one
    carrying `cache_control` (on the message or on one of its parts); 0 when none does."""
    return max((i + 1 for i, m in enumerate(messages) if isinstance(m, Mapping) and _has_cache_control(m)), default=0)


def is_long_query(tokens: int) -> bool:
    """True when a last user message of `tokens` tokens is documents followed by a question: its last
    QUERY_TOKENS tokens are then the query."""
    return tokens > LONG_QUERY


@dataclass(frozen=True)
class ChatSplit:
    """A chat's messages by what may become of them (indices into the messages, ascending).

    texts: each text message's text (empty ones left out); last_user: the last user message (None: there
    is none); query: its text (None: it holds none); compressible: the messages that may be compressed;
    by_its_end: the last user message may be compressed by its own end when long (its content is text
    only, outside the cached prefix); counted: the messages whose tokens are counted one by one (the
    compressible ones, and the last user message when its query text may be long: it has more than
    LONG_QUERY bytes, and a token is at least a byte); kept: the other messages whose text counts
    against the budget, together (whole whatever their length); instructions: the compressible system
    and developer messages (compressed only past LONG_INSTRUCTIONS tokens)."""

    texts: dict[int, str]
    last_user: int | None
    query: str | None
    compressible: tuple[int, ...]
    by_its_end: bool
    counted: tuple[int, ...]
    kept: tuple[int, ...]
    instructions: tuple[int, ...] = ()

    def floor(self, index: int) -> int:
        """The tokens message `index` keeps whole: it is compressed only when longer."""
        return LONG_INSTRUCTIONS if index in self.instructions else QUERY_TOKENS

    def text(self, index: int) -> str:
        """The text counted for message `index`: its text, or the last user message's query text."""
        return self.query if index == self.last_user and self.query is not None else self.texts[index]

    def joined(self, indices: Sequence[int]) -> str:
        """The texts of these messages as one text, to count their tokens together."""
        return SEPARATOR.join(self.text(i) for i in indices)

    def whole_chat(self) -> str:
        """Every counted and kept message's text as one text (the chat's size in one count)."""
        return self.joined(sorted(self.counted + self.kept))


def split_chat(messages: Sequence[Any]) -> ChatSplit:
    """The split of an OpenAI chat (a list of {"role", "content", ...}; other items are left alone)."""
    last, pinned = last_user_index(messages), cached_prefix(messages)
    texts = {i: text for i, m in enumerate(messages)
             if isinstance(m, Mapping) and (text := message_text(m.get("content")))}
    query = query_text(messages[last].get("content")) if last is not None else None
    outside = [i for i in texts if i >= pinned and i != last]
    instructions = tuple(i for i in outside if messages[i].get("role") in INSTRUCTION_ROLES
                         and len(texts[i].encode()) > LONG_INSTRUCTIONS)  # may be long: a token is at least a byte
    compressible = tuple(sorted(instructions + tuple(i for i in outside if messages[i].get("role") in COMPRESSED_ROLES)))
    long = query is not None and len(query.encode()) > LONG_QUERY  # it may be long (a token is at least a byte)
    counted = tuple(sorted(compressible + ((last,) if long else ())))
    asked = [last] if last is not None and not long and (query is not None or last in texts) else []
    kept = tuple(sorted([i for i in texts if i not in compressible and i != last] + asked))
    by_its_end = last in texts and last >= pinned and query is not None
    return ChatSplit(texts, last, query, compressible, by_its_end, counted, kept, instructions)


@dataclass(frozen=True)
class Share:
    """One message to compress: its index, its tokens, and the tokens it may keep (`budget`; when they
    hold it, it passes whole). by_its_end: the long last user message, whose last QUERY_TOKENS tokens
    are the query and stay, within its budget."""

    index: int
    tokens: int
    budget: int
    by_its_end: bool = False

    @property
    def whole(self) -> bool:
        """Its budget holds it: it passes as it came."""
        return self.tokens <= self.budget

    @property
    def kept(self) -> int:
        """Its tokens after compression."""
        return min(self.tokens, self.budget)


def share_budget(split: ChatSplit, tokens: Mapping[int, int], kept_tokens: int, budget: int) -> list[Share]:
    """The messages of `split` to compress, ascending, each with its share of `budget` (the whole chat's
    tokens after compression). tokens: each of `split.counted` messages' tokens; kept_tokens: those of
    `split.kept`. What stays whole (kept messages, short ones, the long last user message's query)
    counts first; the rest of the budget, at least one token each, is shared in proportion to the
    compressed tokens. Messages left out stay whole."""
    sizes = {i: tokens[i] for i in split.compressible if tokens[i] > split.floor(i)}
    end = split.last_user
    if split.by_its_end and end in split.counted and is_long_query(tokens[end]):
        sizes[end] = tokens[end] - QUERY_TOKENS
    if not sizes:
        return []
    whole = kept_tokens + sum(tokens[i] for i in split.counted) - sum(sizes.values())
    room = max(len(sizes), budget - whole)
    total = sum(sizes.values())
    return [Share(i, tokens[i], max(1, room * size // total) + (QUERY_TOKENS if i == end else 0), i == end)
            for i, size in sorted(sizes.items())]


def _is_text_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)


def _has_cache_control(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    return message.get("cache_control") is not None or (isinstance(content, list) and any(
        isinstance(p, dict) and p.get("cache_control") is not None for p in content))
