"""The engine request formats the sidecar compresses, one small class each: where the prompt sits in
the body, and how the body looks with a compressed prompt in its place. Every other field passes
through untouched. Plain prompts (text or token IDs) are forwarded as token IDs when the engine's
tokenizer is ours; conversations (chat, Responses, Anthropic Messages) always go back to their own
route as messages, each compressed message's text in its place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Prompt:
    """A compressible plain prompt: text or token IDs."""

    text: str | None = None
    ids: list[int] | None = None


class RouteFormat:
    """One compressible route. `prompt` returns None for prompts it forwards as they are
    (batches, mixed arrays); InputError only where the sidecar itself cannot proceed."""

    path: str = ""
    name: str = ""
    prompt_field: str = "prompt"
    ids_field: str = "prompt"
    conversation = ""  # the API contract/conversation.py reads; "" for plain prompts

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


class SGLangGenerate(RouteFormat):
    """SGLang's native `POST /generate`: `text` or `input_ids` (lists of them are batches)."""

    path, name, prompt_field, ids_field = "/generate", "sglang.generate", "text", "input_ids"


class OpenAICompletions(RouteFormat):
    """`POST /v1/completions` (SGLang, vLLM, llama.cpp): `prompt` as text or token IDs."""

    path, name = "/v1/completions", "openai.completions"


class LlamaCppCompletion(RouteFormat):
    """llama.cpp's `POST /completion`: `prompt` as text or token IDs (arrays get no BOS)."""

    path, name = "/completion", "llamacpp.completion"


class ConversationFormat(RouteFormat):
    """A route whose prompt is a conversation (contract/conversation.py reads it): compressed message by
    message and sent back to the same route as text, so the engine applies its own chat template,
    tool-call and reasoning parsers, and answers in the API's own shape (streamed or not)."""

    conversation = ""  # the API name contract/conversation.py reads the body as


class OpenAIChat(ConversationFormat):
    """`POST /v1/chat/completions` (SGLang, vLLM, llama.cpp): `messages`, tool calls and results, content parts."""

    path, name, conversation = "/v1/chat/completions", "openai.chat", "openai.chat"


class OpenAIResponses(ConversationFormat):
    """`POST /v1/responses` (vLLM, SGLang): `instructions` and `input` items, function calls and their outputs."""

    path, name, conversation = "/v1/responses", "openai.responses", "openai.responses"


class AnthropicMessages(ConversationFormat):
    """`POST /v1/messages` (vLLM, llama.cpp): Anthropic's `system` and `messages`, tool_use and tool_result blocks."""

    path, name, conversation = "/v1/messages", "anthropic.messages", "anthropic.messages"


FORMATS: tuple[RouteFormat, ...] = (SGLangGenerate(), OpenAICompletions(), LlamaCppCompletion(), OpenAIChat(),
                                     OpenAIResponses(), AnthropicMessages())


def _ids_prompt(value: Any) -> Prompt | None:
    if isinstance(value, list) and value and all(type(i) is int for i in value):
        return Prompt(ids=value)
    return None
