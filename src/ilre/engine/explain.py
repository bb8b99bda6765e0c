"""The explanation view: one self-contained HTML page showing why each context token was kept.

The context is shown token by token: a heat behind each token (its score's rank among the context's
scores, so that scores spread over orders of magnitude stay readable) and a blue underline under
every kept token; hovering shows the token's index and score. With units (granularity "unit"), a bar
starts each unit (a thick blue one where the unit was kept whole). Above it: the model, the retrieval
layer, the strategy, how the budget was shared out (the sink, then Algorithm 1's kernel
combinations for ilre), the counts and the timings. No scripts, no external resources.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import torch

STYLE = """
body { font: 14px/1.5 system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #1b1b1b; }
h1 { font-size: 1.3em; } h2 { font-size: 1.05em; margin-top: 1.6em; }
table.facts td { padding: 0.1em 1.2em 0.1em 0; vertical-align: top; }
table.facts td:first-child { color: #555; }
.split { display: flex; flex-wrap: wrap; gap: 0.3em; }
.split span { border: 1px solid #ccc; border-radius: 3px; padding: 0 0.4em; font-size: 12px; }
.legend span { padding: 0 0.5em; margin-right: 0.6em; }
#context { white-space: pre-wrap; font: 13px/1.9 ui-monospace, monospace; border: 1px solid #ddd; padding: 1em; }
#context span { background: rgba(255, 120, 0, var(--heat)); }
#context span.kept { border-bottom: 2px solid #1f5fd6; color: #0b2f7a; }
#context span.unit { background: none; border-left: 1px solid #b7b7b7; padding-left: 1px; }
#context span.unit.whole { border-left: 3px solid #1f5fd6; }
.query { white-space: pre-wrap; font-family: ui-monospace, monospace; background: #f4f4f4; padding: 0.5em; }
"""


@dataclass(frozen=True)
class ExplanationFacts:
    """What the page states besides the tokens."""

    model: str
    layer: int
    strategy: str
    dca: bool
    budget: int
    sink: int
    budget_split: list[tuple[str, int]]
    query: str
    timings_ms: dict[str, float]
    passthrough: bool
    granularity: str = "token"


def heat(scores: torch.Tensor | None, length: int) -> list[float]:
    """Per-token heat in [0, 1]: the score's rank among the context's, cubed (the top stands out)."""
    if scores is None:
        return [0.0] * length
    ranks = torch.empty(length, dtype=torch.float32)
    ranks[torch.sort(scores.float().cpu(), stable=True).indices] = torch.arange(length, dtype=torch.float32)
    return ((ranks / max(1, length - 1)) ** 3).tolist()


def render_explanation(tokens: list[str], scores: torch.Tensor | None, kept: list[int], facts: ExplanationFacts,
                       units: list[int] | None = None) -> str:
    """tokens: the context's tokens as text (L,); scores: the strategy's (L,) scores (None when the
    context passed through); kept: kept indices; units: (U+1) unit bounds when units were kept -> the HTML page."""
    length = len(tokens)
    kept_set = set(kept)
    heats = heat(scores, length)
    values = scores.float().cpu().tolist() if scores is not None else [None] * length
    spans = []
    for i, (token, h, value) in enumerate(zip(tokens, heats, values)):
        title = f"#{i}" + ("" if value is None else f" score {value:.4g}") + (" kept" if i in kept_set else "")
        spans.append(f'<span data-i="{i}" class="{"kept" if i in kept_set else "drop"}" style="--heat:{h:.3f}" '
                     f'title="{title}">{html.escape(token)}</span>')
    unit_fact = []
    if units is not None:
        whole = 0
        grouped = []
        for u, (a, z) in enumerate(zip(units, units[1:])):
            inside = sum(1 for i in range(a, z) if i in kept_set)
            whole += inside == z - a
            state = "whole" if inside == z - a else "part" if inside else "dropped"
            grouped.append(f'<span class="unit {state}" title="unit {u}: tokens {a}-{z - 1}, {state}">'
                           + "".join(spans[a:z]) + "</span>")
        spans = grouped
        unit_fact = [("units", f"{len(units) - 1} in the context, {whole} kept whole (sentences, lines, records)")]
    timings = ", ".join(f"{k} {v:.0f} ms" for k, v in facts.timings_ms.items())
    allocated = facts.budget - min(facts.sink, facts.budget)
    split = "".join(f"<span>{html.escape(what)}: {n}</span>" for what, n in facts.budget_split)
    rows = [("model", facts.model), ("retrieval layer", str(facts.layer)), ("strategy", facts.strategy),
            ("dual chunk attention", "on" if facts.dca else "off"), ("granularity", facts.granularity), *unit_fact,
            ("context tokens", f"{length} in, {len(kept)} kept ({100 * len(kept) / max(1, length):.1f}%)"),
            ("budget", "the whole context fits: passed through" if facts.passthrough else
             f"{facts.budget} = {min(facts.sink, facts.budget)} sink + {allocated} allocated"),
            ("timings", timings)]
    facts_html = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>ilre: kept tokens</title><style>{STYLE}</style></head>
<body>
<h1>Why each token was kept</h1>
<table class="facts">{facts_html}</table>
<h2>Query</h2><div class="query">{html.escape(facts.query)}</div>
<h2>Budget split{"" if facts.passthrough else f" of the {allocated} allocated tokens"}</h2>
<div class="split">{split if not facts.passthrough else "<span>none: nothing was dropped</span>"}</div>
<h2>Context</h2>
<p class="legend"><span style="background: rgba(255,120,0,1)">highest score</span>
<span style="background: rgba(255,120,0,0.1)">low score</span>
<span style="border-bottom: 2px solid #1f5fd6">kept</span> (hover a token for its index and score)</p>
<div id="context">{"".join(spans)}</div>
</body></html>
"""
