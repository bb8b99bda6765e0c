"""The long prompts of the sidecar tests and benchmark: Shakespeare with one planted fact and a
question about it, and what `ilre compress` keeps of them."""

from __future__ import annotations

from ilre.contract.messages import CompressRequest
from ilre.evaluation.tasks.haystack import filler_ids

FACT = "\n\nThe vault code of the Duke of Milan's museum is 7302946.\n\n"
QUESTION = ("\n\nQuestion: What is the vault code of the Duke of Milan's museum?\n"
            "Answer: The vault code of the Duke of Milan's museum is")
CHAT_QUESTION = "What is the vault code of the Duke of Milan's museum? Reply with the number."


def haystack(tokenizer, n_tokens: int, source: str = "shakespeare") -> str:
    """`n_tokens` of Shakespeare (or "pydoc": Python's reference text) with FACT planted at 40%."""
    filler = tokenizer.decode(filler_ids(tokenizer, n_tokens, source))
    at = filler.rfind("\n", 0, int(len(filler) * 0.4)) + 1
    return filler[:at] + FACT + filler[at:]


def over_the_window(tokenizer) -> str:
    """~4,120 tokens with FACT planted and QUESTION last: over a 4,096-token engine window, while its context (all
    but a 64-token query) is within the default's 4 x 1,024 candidates, so the cascade reads it to l_R once and
    the document cache answers a module's later requests of it from that encoding."""
    return haystack(tokenizer, 4070) + QUESTION


def reference_ids(engine, ids: list[int], n_query: int, budget: int = 1024) -> list[int]:
    """What `ilre compress` returns for the same context/query split."""
    result = engine.compress(CompressRequest(context_ids=ids[:-n_query], query_ids=ids[-n_query:], budget=budget))
    return result.token_ids
