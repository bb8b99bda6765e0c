"""The engine request formats the sidecar compresses, one small class each: where the prompt sits in
the body, and how the body looks with a compressed prompt in its place. Every other field passes
through untouched. Chat requests forwarded as token IDs go to the engine's `/v1/completions` (no
engine takes token IDs on its OpenAI chat route) and their answers are reshaped into chat answers.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from ...engine.chat import message_text


@dataclass(frozen=True)
class Prompt:
    """A compressible prompt: text, token IDs, or chat messages (string contents)."""

    text: str | None = None
    ids: list[int] | None = None
    messages: list[dict[str, Any]] | None = None


class RouteFormat:
    """One compressible route. `prompt` returns None for prompts it forwards as they are
    (batches, mixed arrays); InputError only where the sidecar itself cannot proceed."""

    path: str = ""
    name: str = ""
    prompt_field: str = "prompt"
    ids_field: str = "prompt"
    chat = False  # prompts are messages: split at the last user turn, answers may need reshaping

    def prompt(self, body: dict[str, Any]) -> Prompt | None:
        value = body.get(self.prompt_field)
        if isinstance(value, str):
            return Prompt(text=value) if value else None
        if self.ids_field == self.prompt_field:
            return _ids_prompt(value)
        return _ids_prompt(body.get(self.ids_field)) if value is None else None

    def with_ids(self, body: dict[str, Any], ids: list[int]) -> tuple[str, dict[str, Any]]:
        """(engine path, body) carrying the token IDs instead of the prompt."""
        out = {k: v for k, v in body.items() if k != self.prompt_field}
        out[self.ids_field] = ids
        return self.path, out

    def with_text(self, body: dict[str, Any], text: str) -> tuple[str, dict[str, Any]]:
        out = {k: v for k, v in body.items() if k != self.ids_field}
        out[self.prompt_field] = text
        return self.path, out

    def needs_chat_route(self, body: dict[str, Any]) -> bool:
        """Requests that must stay on the engine's chat route even when IDs could be forwarded."""
        return False


class SGLangGenerate(RouteFormat):
    """SGLang's native `POST /generate`: `text` or `input_ids` (lists of them are batches)."""

    path, name, prompt_field, ids_field = "/generate", "sglang.generate", "text", "input_ids"


class OpenAICompletions(RouteFormat):
    """`POST /v1/completions` (SGLang, vLLM, llama.cpp): `prompt` as text or token IDs."""

    path, name = "/v1/completions", "openai.completions"


class LlamaCppCompletion(RouteFormat):
    """llama.cpp's `POST /completion`: `prompt` as text or token IDs (arrays get no BOS)."""

    path, name = "/completion", "llamacpp.completion"


class OpenAIChat(RouteFormat):
    """`POST /v1/chat/completions`: `messages` rendered with the model's chat template."""

    path, name, chat = "/v1/chat/completions", "openai.chat", True
    # request fields that only exist on the chat route; tools need the engine's own chat handling
    CHAT_ONLY = ("messages", "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call",
                 "chat_template", "chat_template_kwargs", "add_generation_prompt", "continue_final_message",
                 "max_completion_tokens", "logprobs", "top_logprobs", "reasoning_effort")

    def prompt(self, body: dict[str, Any]) -> Prompt | None:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        plain = []
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                return None  # the engine reports malformed messages in its own words
            content = message_text(message.get("content"))
            if content is None:
                return None  # images, audio, tool calls: forwarded as they are
            plain.append({**message, "content": content})
        return Prompt(messages=plain)

    def needs_chat_route(self, body: dict[str, Any]) -> bool:
        """Requests whose features only the chat route has: tools, the engine's own template."""
        return any(body.get(k) for k in ("tools", "functions", "chat_template", "continue_final_message"))

    def with_ids(self, body: dict[str, Any], ids: list[int]) -> tuple[str, dict[str, Any]]:
        out = {k: v for k, v in body.items() if k not in self.CHAT_ONLY}
        out["prompt"] = ids
        if body.get("max_completion_tokens") is not None and "max_tokens" not in body:
            out["max_tokens"] = body["max_completion_tokens"]
        if body.get("logprobs"):
            out["logprobs"] = body.get("top_logprobs") or 1
        return OpenAICompletions.path, out

    def with_messages(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
        return self.path, {**body, "messages": messages}


FORMATS: tuple[RouteFormat, ...] = (SGLangGenerate(), OpenAICompletions(), OpenAIChat(), LlamaCppCompletion())


def _ids_prompt(value: Any) -> Prompt | None:
    if isinstance(value, list) and value and all(type(i) is int for i in value):
        return Prompt(ids=value)
    return None


def chat_from_completion(data: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI completion answer reshaped as a chat completion (choices[].text -> message)."""
    choices = [{"index": c.get("index", i), "message": {"role": "assistant", "content": c.get("text", "")},
                "logprobs": c.get("logprobs"), "finish_reason": c.get("finish_reason")}
               for i, c in enumerate(data.get("choices") or [])]
    out = {k: v for k, v in data.items() if k not in ("id", "choices", "object")}
    return {"id": chat_id(data.get("id")), "object": "chat.completion", "created": data.get("created", int(time.time())),
            **out, "choices": choices}


def chat_chunk_from_completion(data: dict[str, Any], started: set[int]) -> dict[str, Any]:
    """One streamed completion chunk as a chat.completion.chunk; the first delta of each choice
    carries the assistant role (`started` remembers which choices have begun)."""
    choices = []
    for i, c in enumerate(data.get("choices") or []):
        index = c.get("index", i)
        delta: dict[str, Any] = {"content": c.get("text", "")}
        if index not in started:
            started.add(index)
            delta = {"role": "assistant", **delta}
        choices.append({"index": index, "delta": delta, "logprobs": c.get("logprobs"),
                        "finish_reason": c.get("finish_reason")})
    out = {k: v for k, v in data.items() if k not in ("id", "choices", "object")}
    return {"id": chat_id(data.get("id")), "object": "chat.completion.chunk", **out, "choices": choices}


def chat_id(completion_id: Any) -> str:
    """The chat answer's id for a completion's: `cmpl-X` -> `chatcmpl-X`, as the engines' own chat
    routes name theirs (the same completion id gives the same chat id, chunk after chunk)."""
    text = completion_id if isinstance(completion_id, str) and completion_id else uuid.uuid4().hex
    if text.startswith("chatcmpl-"):
        return text
    return "chatcmpl-" + text.removeprefix("cmpl-")


async def map_sse(chunks: AsyncIterator[bytes], convert: Callable[[dict[str, Any]], dict[str, Any]]) -> AsyncIterator[bytes]:
    """Re-emit a server-sent-event stream with each JSON `data:` payload passed through `convert`,
    one event at a time (only the event being read is held); `[DONE]`, comments and error events
    pass unchanged."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        while True:
            cut = _event_end(pending)
            if cut is None:
                break
            event, pending = pending[:cut[0]], pending[cut[1]:]
            yield _map_event(event, convert) + b"\n\n"
    if pending.strip():
        yield _map_event(pending.rstrip(b"\r\n"), convert) + b"\n\n"


def _event_end(buffer: bytes) -> tuple[int, int] | None:
    """(end of the first event, start of the next) in `buffer`, or None if no event is complete."""
    ends = [(i, i + len(sep)) for sep in (b"\n\n", b"\r\n\r\n") if (i := buffer.find(sep)) >= 0]
    return min(ends) if ends else None


def _map_event(event: bytes, convert: Callable[[dict[str, Any]], dict[str, Any]]) -> bytes:
    lines = event.replace(b"\r\n", b"\n").split(b"\n")
    out = []
    for line in lines:
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            try:
                data = json.loads(payload)
            except ValueError:
                out.append(line)  # [DONE] and anything that is not JSON
                continue
            if isinstance(data, dict) and "error" not in data:
                line = b"data: " + json.dumps(convert(data), ensure_ascii=False).encode()
        out.append(line)
    return b"\n".join(out)

