"""How close one question asked of a conversation's messages together (compressor/shared_query.py: one pass after
the conversation's end, moved to each message) comes to asking each message alone (its own query pass against its
own window), on real files.

Conversations of --messages tool results (~--tokens-token slices of Python's standard library sources, one file
each), an audit code planted in the first; every step asks for that code. For each step, the same request both
ways under each --strategies entry: alone (each message by its document_id, one request each) and together (one
request by document_ids). Printed per strategy: the share of the lone path's kept tokens the shared path keeps
(mean over messages and steps), how often each path keeps the planted line whole, and the time of a step both ways.

    .venv/bin/python bench/shared_question_agreement.py [--conversations 6] [--messages 8] [--dtype auto]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import sysconfig
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ilre.contract.messages import CompressRequest  # noqa: E402
from ilre.engine.documents import DocumentCache  # noqa: E402
from ilre.engine.engine import Engine, EngineConfig  # noqa: E402

STDLIB = Path(sysconfig.get_paths()["stdlib"])
STRATEGIES = {"deepened (ilre at 19 + layer 8)": ("ilre", {"also_layers": [8]}), "default (cascade)": ("cascade", {})}


def sources(tokenizer, count: int, tokens: int, seed: int) -> list[tuple[str, str]]:
    """(name, text) of `count` standard-library files of at least `tokens` tokens, each cut to `tokens`."""
    names = sorted(p for p in STDLIB.glob("*.py") if p.stat().st_size > 8 * tokens)
    random.Random(seed).shuffle(names)
    out = []
    for path in names[:count]:
        ids = tokenizer(path.read_text(errors="replace")).input_ids[:tokens]
        out.append((path.name, tokenizer.decode(ids)))
    return out


def planted(name: str, text: str, rng: random.Random) -> tuple[str, str]:
    """The text with one line naming its audit code at a random line start; (text, the line)."""
    code = f"{rng.choice(['ZEBRA', 'OTTER', 'MAPLE', 'COMET'])}-{rng.randrange(1000, 9999)}"
    line = f"# AUDIT: the audit code of {name} is {code}."
    starts = [i + 1 for i, c in enumerate(text) if c == "\n"][5:-5]
    at = rng.choice(starts)
    return text[:at] + line + "\n" + text[at:], line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--messages", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=1100)
    parser.add_argument("--ratio", type=float, default=0.12)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    engine = Engine(EngineConfig(dtype=args.dtype, deepen=True))
    print(f"# {engine.placement.describe()}, l_R {engine.layer}, {args.conversations} conversations x "
          f"{args.messages} messages of {args.tokens} tokens, ratio {args.ratio}")
    rng = random.Random(7)
    files = sources(engine.tokenizer, args.conversations * args.messages, args.tokens, seed=3)
    rows: dict[str, dict[str, list[float]]] = {name: {"overlap": [], "alone": [], "together": [], "alone_s": [],
                                                      "together_s": []} for name in STRATEGIES}
    for c in range(args.conversations):
        chat = files[c * args.messages:(c + 1) * args.messages]
        first, line = planted(*chat[0], rng)
        texts = [first] + [text for _, text in chat[1:]]
        question = f"What is the audit code of {chat[0][0]}? Reply with the code."
        for label, (strategy, options) in STRATEGIES.items():
            engine.documents = DocumentCache(1 << 30)
            docs = [engine.compress(CompressRequest(context=t, query=".", ratio=1.0)).document_id for t in texts]
            for step in range(1, args.messages + 1):
                asked = dict(query=question, ratio=args.ratio, granularity="unit", strategy=strategy,
                             strategy_options=options)
                clock = time.perf_counter()
                alone = [engine.compress(CompressRequest(document_id=d, **asked)) for d in docs[:step]]
                rows[label]["alone_s"].append(time.perf_counter() - clock)
                clock = time.perf_counter()
                together = engine.compress(CompressRequest(document_ids=docs[:step], **asked)).results
                rows[label]["together_s"].append(time.perf_counter() - clock)
                for a, t in zip(alone, together):
                    kept = set(a.kept_indices)
                    rows[label]["overlap"].append(len(kept & set(t.kept_indices)) / max(1, len(kept)))
                rows[label]["alone"].append(float(line in alone[0].compressed_context))
                rows[label]["together"].append(float(line in together[0].compressed_context))
        print(f"conversation {c + 1}: " + "; ".join(
            f"{label}: fact alone {sum(r['alone'][-args.messages:]):.0f}/{args.messages}, together "
            f"{sum(r['together'][-args.messages:]):.0f}/{args.messages}" for label, r in rows.items()), flush=True)
    print("| strategy | kept tokens in common | fact kept alone | fact kept together | step alone (s) | step together (s) |")
    print("|---|---|---|---|---|---|")
    for label, r in rows.items():
        n = len(r["alone"])
        print(f"| {label} | {statistics.mean(r['overlap']):.1%} | {sum(r['alone']):.0f}/{n} | "
              f"{sum(r['together']):.0f}/{n} | {statistics.mean(r['alone_s']):.3f} | {statistics.mean(r['together_s']):.3f} |")


if __name__ == "__main__":
    main()
