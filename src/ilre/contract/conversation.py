"""A conversation as each API sends it, read as one list of chat messages and written back with some
texts replaced. Every door that compresses a conversation (the sidecar, the gateway, the LiteLLM hook)
reads it here, so contract/chat.py's rules (what is the query, what is compressed, each message's share
of the budget) apply to the same messages whichever API carried them.

The reading: one plain message {"role", "content": str | None} per text or non-text piece of the body,
in the order the model reads them (an API's system field first). A text piece becomes a message whose
content is that text, with the path of the text in the body; anything else (a tool call and its
arguments, an image, audio, a file, a reasoning item) becomes a message with content None, which
contract/chat.py leaves as it is. A `cache_control` on a piece (or on the message holding it) travels
with it, so the prompt-cache breakpoint pins the same prefix.

- OpenAI chat (`messages`): a string content, or each `text` part of a list content. Roles as sent
  ("tool" and "function" results are compressible).
- OpenAI Responses (`instructions`, `input`): `instructions` as a system message; `input` as a
  string (one user message) or items: messages (string content, or `input_text` / `output_text` parts),
  `function_call_output` and `custom_tool_call_output` (their `output`, a string or text parts) as tool
  results; `function_call`, `reasoning` and every other item kept.
- Anthropic Messages (`system`, `messages`): `system` as a string or text blocks; a message's string
  content or its `text` blocks under its role; a `tool_result` block's content (a string or text
  blocks) as a tool result; `tool_use`, `image`, `document`, `thinking` and other blocks kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

Path = tuple[str | int, ...]  # keys and list indices from the body to a text
TEXT_PARTS = {"openai.chat": ("text",), "openai.responses": ("input_text", "output_text", "text"),
              "anthropic.messages": ("text",)}
TOOL_OUTPUTS = ("function_call_output", "custom_tool_call_output")  # Responses items whose `output` is a tool's


class NotReadable(ValueError):
    """The body is not a conversation this module can read; `field` names where (the engine reports
    malformed requests in its own words, so a caller forwards such a body as it came)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class Conversation:
    """A body read as plain messages. messages[i]: {"role", "content": str | None, "cache_control"?};
    paths[i]: where messages[i]'s text sits in the body (None for a non-text piece)."""

    api: str
    messages: list[dict[str, Any]]
    paths: list[Path | None]

    def field(self, index: int) -> str:
        """Message `index`'s place in the body as a client writes it: `messages[3].content[1].text`."""
        return _name(self.paths[index] or ())

    def write(self, body: Mapping[str, Any], texts: Mapping[int, str]) -> dict[str, Any]:
        """`body` with the text of each message index in `texts` replaced; everything else (and every
        container off those paths) is the same object it was."""
        out: Any = dict(body)
        for index, text in texts.items():
            path = self.paths[index]
            if path is None:
                raise ValueError(f"message {index} holds no text to replace")
            out = _replaced(out, path, text)
        return out


def read_conversation(api: str, body: Mapping[str, Any]) -> Conversation:
    """The conversation of an `api` body ("openai.chat", "openai.responses", "anthropic.messages");
    NotReadable naming the field when it is not one."""
    reader = READERS.get(api)
    if reader is None:
        raise ValueError(f"api: no conversation reader for {api!r} (known: {', '.join(READERS)})")
    builder = _Builder(api)
    reader(builder, body)
    if not builder.messages:
        raise NotReadable("messages", "no message to read")
    return Conversation(api, builder.messages, builder.paths)


class _Builder:
    def __init__(self, api: str):
        self.kinds = TEXT_PARTS[api]
        self.messages: list[dict[str, Any]] = []
        self.paths: list[Path | None] = []

    def add(self, role: str, text: str | None, path: Path | None, cache: Any = None) -> None:
        message: dict[str, Any] = {"role": role, "content": text}
        if cache is not None:
            message["cache_control"] = cache
        self.messages.append(message)
        self.paths.append(path if text is not None else None)

    def content(self, role: str, content: Any, path: Path, cache: Any = None) -> None:
        """A content that is a string, null, or a list of parts/blocks (text ones read, others kept)."""
        if isinstance(content, str) or content is None:
            self.add(role, content, path, cache)
            return
        if not isinstance(content, list):
            raise NotReadable(_name(path), "must be a string, a list of parts or null")
        if not content:
            self.add(role, None, None, cache)
            return
        for j, part in enumerate(content):
            self.part(role, part, path + (j,), cache)

    def part(self, role: str, part: Any, path: Path, cache: Any = None) -> None:
        """One part of a list content: its text when it is a text part, else kept."""
        if not isinstance(part, dict):
            raise NotReadable(_name(path), "must be an object")
        here = part.get("cache_control", cache)
        if part.get("type") in self.kinds and isinstance(part.get("text"), str):
            self.add(role, part["text"], path + ("text",), here)
        else:
            self.add(role, None, None, here)


def _read_openai_chat(b: _Builder, body: Mapping[str, Any]) -> None:
    for i, message in enumerate(_items(body, "messages")):
        role = _role(message, f"messages[{i}]")
        b.content(role, message.get("content"), ("messages", i, "content"), message.get("cache_control"))


def _read_responses(b: _Builder, body: Mapping[str, Any]) -> None:
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        b.add("system", instructions, ("instructions",))
    given = body.get("input")
    if isinstance(given, str):
        b.add("user", given, ("input",))
        return
    for i, item in enumerate(_items(body, "input")):
        kind = item.get("type", "message")
        if kind == "message":
            b.content(_role(item, f"input[{i}]"), item.get("content"), ("input", i, "content"))
        elif kind in TOOL_OUTPUTS:
            b.content("tool", item.get("output"), ("input", i, "output"))
        else:  # function_call, reasoning, item_reference, ...: the model's own, kept
            b.add("assistant", None, None)


def _read_anthropic(b: _Builder, body: Mapping[str, Any]) -> None:
    if body.get("system") is not None:
        b.content("system", body["system"], ("system",))
    for i, message in enumerate(_items(body, "messages")):
        role, content = _role(message, f"messages[{i}]"), message.get("content")
        if not isinstance(content, list):
            b.content(role, content, ("messages", i, "content"))
            continue
        for j, block in enumerate(content):
            if isinstance(block, dict) and block.get("type") == "tool_result":
                b.content("tool", block.get("content"), ("messages", i, "content", j, "content"), block.get("cache_control"))
            else:
                b.part(role, block, ("messages", i, "content", j), message.get("cache_control"))


READERS: dict[str, Callable[[_Builder, Mapping[str, Any]], None]] = {
    "openai.chat": _read_openai_chat, "openai.responses": _read_responses, "anthropic.messages": _read_anthropic}


def _items(body: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    items = body.get(name)
    if not isinstance(items, list) or not items:
        raise NotReadable(name, "must be a non-empty list")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise NotReadable(f"{name}[{i}]", "must be an object")
    return items


def _role(message: Mapping[str, Any], where: str) -> str:
    role = message.get("role")
    if not isinstance(role, str):
        raise NotReadable(f"{where}.role", "must be a string")
    return role


def _name(path: Path) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(path))


def _replaced(container: Any, path: Path, value: Any) -> Any:
    """A copy of `container` with `value` at `path`, copying only the containers on the path."""
    head, rest = path[0], path[1:]
    copy = list(container) if isinstance(container, list) else dict(container)
    copy[head] = value if not rest else _replaced(container[head], rest, value)
    return copy
