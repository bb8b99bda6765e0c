"""Samples from real files the suite does not generate: a table, a log of this machine and a price table.

- `pypi_tsv`: `/usr/share/package-lists/pypi.tsv`, a tab-separated table of PyPI packages (name,
  version, month, rank, summary) sorted by name, so neighbouring rows have similar names; a window
  of consecutive rows under the header, the question asks one row's version (unique in the window).
- `dpkg_log`: `/var/log/dpkg.log`, Debian's package log (install, upgrade, status lines); a window of
  consecutive lines, the question asks the version one package was installed or upgraded to.
- `litellm_prices`: LiteLLM's model price table (`model_prices_and_context_window_backup.json` in the
  environment `make litellm` builds), pretty-printed JSON records of many fields per model; a window of
  consecutive models (re-serialised as the file is, indent 4), the question asks one model's cost or
  token limit whose value occurs once in the window.

evaluation/running/real_files.py measures them, evaluation/report/real_files.py writes their section.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SOURCES = {"pypi_tsv": Path("/usr/share/package-lists/pypi.tsv"), "dpkg_log": Path("/var/log/dpkg.log"),
           "litellm_prices": next(Path(".venv-litellm/lib").glob("python3*/site-packages/litellm/"
                                                                  "model_prices_and_context_window_backup.json"),
                                  Path(".venv-litellm/model_prices_and_context_window_backup.json"))}
PRICE_FIELDS = ("output_cost_per_token", "input_cost_per_token", "max_input_tokens", "max_output_tokens")


def _question(corpus: str, line: str) -> tuple[str, str] | None:
    """(question with answer prefix, answer) for one line of the corpus, or None when it asks nothing."""
    fields = line.split("\t") if corpus == "pypi_tsv" else line.split()
    if corpus == "pypi_tsv":
        if len(fields) < 2 or len(fields[1]) < 5 or fields[1] in fields[0]:
            return None
        name, version = fields[0], fields[1]
        return (f"\nQuestion: What is the version of the package {name} in the table above? "
                f"Answer: The version of {name} is", version)
    if len(fields) == 6 and fields[2] in ("install", "upgrade") and fields[5] != "<none>":
        package = fields[3].split(":")[0]
        verb = "installed" if fields[2] == "install" else "upgraded"
        return f"\nQuestion: To which version was {package} {verb} in the log above? Answer: version", fields[5]
    return None


def json_sample(tokenizer, models: dict, length: int, index: int) -> dict | None:
    """A window of consecutive models of LiteLLM's price table of about `length` tokens, and a question
    about one model's field whose value occurs once in the window."""
    rng = random.Random(f"litellm_prices-{length}-{index}")
    names = [n for n, v in models.items() if isinstance(v, dict) and n != "sample_spec"]
    per_model = len(tokenizer(json.dumps({n: models[n] for n in names[:100]}, indent=4), add_special_tokens=False
                              ).input_ids) / 100
    count = min(len(names), int(length / per_model))
    start = rng.randrange(0, max(1, len(names) - count))
    for _ in range(2):  # the first guess, then one correction by the window's own tokens per model
        window = {n: models[n] for n in names[start: start + count]}
        context = json.dumps(window, indent=4)
        tokens = len(tokenizer(context, add_special_tokens=False).input_ids)
        count = min(len(names) - start, int(count * length / tokens))
    asked = [(n, f, json.dumps(v[f])) for n, v in window.items() for f in PRICE_FIELDS
             if f in v and len(json.dumps(v[f])) >= 4 and context.count(json.dumps(v[f])) == 1]
    if not asked:
        return None
    name, field, value = rng.choice(asked)
    question = f"\nQuestion: What is the {field} of the model {name} in the JSON above? Answer: The {field} of {name} is"
    return {"context": context, "query": question, "answer": value, "line": f'"{field}": {value}'}


def make_sample(tokenizer, corpus: str, lines: list[str], length: int, index: int) -> dict | None:
    """A window of consecutive lines of about `length` tokens and a question about one of its lines."""
    if corpus == "litellm_prices":
        return json_sample(tokenizer, json.loads("\n".join(lines)), length, index)
    rng = random.Random(f"{corpus}-{length}-{index}")
    header = lines[0] + "\n" if corpus == "pypi_tsv" else ""
    body = lines[1:] if header else lines
    per_line = max(1.0, len(tokenizer("\n".join(body[:200]), add_special_tokens=False).input_ids) / 200)
    count = min(len(body), int(length / per_line))
    start = rng.randrange(0, max(1, len(body) - count))
    window = body[start: start + count]
    asked = [(i, q) for i, line in enumerate(window) if (q := _question(corpus, line)) is not None]
    asked = [(i, q) for i, q in asked if corpus != "pypi_tsv" or sum(q[1] in l for l in window) == 1]
    if not asked:
        return None
    row, (question, answer) = rng.choice(asked)
    context = header + "\n".join(window) + "\n"
    return {"context": context, "query": question, "answer": answer, "line": window[row], "header": header}
