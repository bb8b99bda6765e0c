"""What a staged evaluation capped, for the results page: the caps that bound a plan (end to end, full
context, LLMLingua lengths), their widest over every stage that ran, and the page's notes on them."""

from __future__ import annotations

from ..tasks.lengths import length_label
from .lingua import METHODS as LINGUA_METHODS
from .plan import EvalPlan

CAP_FIELDS = ("e2e_max_length", "full_max_length", "lingua_max_length")


def plan_caps(plan: EvalPlan) -> dict[str, int]:
    """The caps that bound what this plan runs (0 = no cap): generation only when it generates,
    full context only when it runs `full`, LLMLingua only when it runs a lingua method."""
    applies = {"e2e_max_length": plan.e2e, "full_max_length": plan.e2e and "full" in plan.strategies,
               "lingua_max_length": any(s in LINGUA_METHODS for s in plan.strategies)}
    return {name: getattr(plan, name) for name in CAP_FIELDS if applies[name]}


def widest_caps(earlier: dict[str, int], now: dict[str, int]) -> dict[str, int]:
    """Caps over staged runs: each the widest any stage ran with (0, no cap, is the widest)."""
    out = dict(earlier)
    for name, cap in now.items():
        out[name] = 0 if 0 in (cap, out.get(name, cap)) else max(cap, out.get(name, cap))
    return out


def caps_notes(plan: EvalPlan, caps: dict[str, int] | None = None) -> dict[str, str]:
    """The page's notes on what was capped; caps default to plan_caps(plan)."""
    caps = plan_caps(plan) if caps is None else caps
    notes = {}
    if caps.get("full_max_length"):
        notes["full"] = (f"full context generates only up to {length_label(caps['full_max_length'])}: a dense prefill "
                         f"of all 30 layers on 2 CPU cores takes minutes per sample beyond that")
    if caps.get("e2e_max_length"):
        notes["e2e"] = f"end to end only up to {length_label(caps['e2e_max_length'])}"
    if plan.e2e:
        if plan.e2e_tasks:
            notes["e2e-tasks"] = f"end to end only on {', '.join(plan.e2e_tasks)}"
        notes["e2e-skip"] = ("niah and vt samples whose compressed context kept no gold answer are scored 0 end to end "
                             "without generating (the answer cannot be produced from the prompt)")
        if plan.max_new_tokens:
            notes["max-new-tokens"] = (f"generation capped at {plan.max_new_tokens} new tokens, or the gold answers' own "
                                       f"tokens plus a margin where that is more (RULER: 128 for niah, 30 vt, 120 cwe, 50 fwe)")
    if caps.get("lingua_max_length"):
        notes["lingua-cap"] = (f"LLMLingua/LongLLMLingua only up to {length_label(caps['lingua_max_length'])}: they run "
                               f"the whole model over every 256-token chunk (minutes per sample on this CPU)")
    if plan.long_tasks and plan.long_from:
        notes["long"] = (f"beyond {length_label(plan.long_from)} only {', '.join(plan.long_tasks)}"
                         + (f", {plan.long_samples} sample(s) each" if plan.long_samples else ""))
    return notes
