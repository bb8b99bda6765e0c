"""`ilre demo` (what `make run` shows): a long generated document with a planted fact, compressed."""

from __future__ import annotations

import sys
from typing import Any

from ..contract.messages import CompressRequest
from ..engine.engine import Engine
from ..evaluation.tasks.haystack import filler_ids
from .output import summary

FACT = "\n\nThe secret ingredient of the Duke of Milan's wine is saffron from Valencia.\n"
QUESTION = "\n\nWhat is the secret ingredient of the Duke of Milan's wine?\nAnswer: The secret ingredient is"


def run_demo_document(engine: Engine, n_tokens: int, defaults: dict[str, Any]) -> int:
    """Plant FACT at 40% of `n_tokens` of Shakespeare, compress for QUESTION, print a summary."""
    filler = engine.tokenizer.decode(filler_ids(engine.tokenizer, n_tokens))
    at = filler.rfind("\n", 0, int(len(filler) * 0.4)) + 1
    context = filler[:at] + FACT + filler[at:]
    result = engine.compress(CompressRequest.from_json({"context": context, "query": QUESTION}, defaults)).to_dict()
    kept = result["compressed_context"]
    survived = FACT.strip() in kept
    print(f"question: {QUESTION.strip()}")
    print(summary(result))
    print(f"planted fact kept whole: {'yes' if survived else 'no'}")
    around = kept.find("saffron")
    if around >= 0:
        print("kept text around it: ..." + kept[max(0, around - 120): around + 60].replace("\n", " ") + "...")
    print(f"timings (ms): {result['timings_ms']}")
    print(f"token_ids for the engine: {len(result['token_ids'])} ids", file=sys.stderr)
    return 0
