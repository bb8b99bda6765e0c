"""Whole units checked on real files the suite does not generate: a table and a log of this machine.

- `pypi_tsv`: `/usr/share/package-lists/pypi.tsv`, a tab-separated table of PyPI packages (name,
  version, month, rank, summary) sorted by name, so neighbouring rows have similar names; a window
  of consecutive rows under the header, the question asks one row's version (unique in the window).
- `dpkg_log`: `/var/log/dpkg.log`, Debian's package log (install, upgrade, status lines); a window of
  consecutive lines, the question asks the version one package was installed or upgraded to.
- `litellm_prices`: LiteLLM's model price table (`model_prices_and_context_window_backup.json` in the
  environment `make litellm` builds), pretty-printed JSON records of many fields per model; a window of
  consecutive models (re-serialised as the file is, indent 4), the question asks one model's cost or
  token limit whose value occurs once in the window.

Each sample is compressed by the engine as a service request would be (the default strategy, budget
1024, DCA auto), with `granularity` token and unit on the same document (the second request reuses
the cached encode). A record says whether the answer survived and whether the asked row (line) was
kept whole (and, in the table, whether its header row was kept), whether the default fell back to the whole
context (compressor/strategies/cascade.py) and the compressor's dtype. Files that are missing are skipped and said so.

    python -m ilre.evaluation.real_files [--lengths 16K,32K] [--samples 10] [--corpora pypi_tsv,dpkg_log,litellm_prices]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from .intervals import paired_difference, wilson
from .ruler import length_label, parse_length

OUTPUT = Path("results/eval/real_files.jsonl")
EARLIER = OUTPUT.with_name("real_files_stage20.jsonl")  # stages 20-21: the default before its fallback
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


def run_real_files(lengths: list[int], samples: int, output: Path = OUTPUT, budget: int = 1024, progress=print,
                   corpora: tuple[str, ...] = tuple(SOURCES)) -> Path:
    """Measure every (corpus, length, index) of `corpora` not yet in `output` (JSONL, appended), in that order;
    returns `output`."""
    from ..engine.engine import Engine, EngineConfig
    from ..engine.messages import CompressRequest

    engine = Engine(EngineConfig())
    done = {(r["corpus"], r["length"], r["index"], r["granularity"]) for r in load(output)}
    output.parent.mkdir(parents=True, exist_ok=True)
    for corpus in corpora:
        path = SOURCES[corpus]
        if not path.is_file():
            progress(f"real files: {path} is not on this machine, {corpus} skipped")
            continue
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
        for length in lengths:
            for index in range(samples):
                if all((corpus, length, index, g) in done for g in ("token", "unit")):
                    continue
                sample = make_sample(engine.tokenizer, corpus, lines, length, index)
                if sample is None:
                    continue
                records = []
                for granularity in ("token", "unit"):
                    tick = time.perf_counter()
                    result = engine.compress(CompressRequest(context=sample["context"], query=sample["query"],
                                                             budget=budget, granularity=granularity))
                    text = result.compressed_context
                    records.append({"corpus": corpus, "length": length, "index": index, "granularity": granularity,
                                    "tokens": result.original_tokens, "kept": sample["answer"] in text,
                                    "line_whole": sample["line"] in text,
                                    "header_kept": sample["header"] in text if sample.get("header") else None,
                                    "seconds": round(time.perf_counter() - tick, 3),
                                    "fell_back": result.fell_back, "dtype": engine.placement.dtype_name})
                engine.documents.clear()
                with output.open("a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in records)
                progress(f"{corpus} {length_label(length)} #{index}: " + " ".join(
                    f"{r['granularity']}={int(r['kept'])}/{int(r['line_whole'])}" for r in records))
    return output


def load(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.is_file() else []


def section(path: Path = OUTPUT, earlier: Path | None = None) -> list[str]:
    """Markdown lines for the results page: per corpus and length, the answer kept and the asked line kept
    whole, token against unit, with the paired difference of the answer kept. `earlier`: records of an
    earlier measurement (another default), shown for the corpora and lengths `path` does not hold yet."""
    records = load(path)
    held = {(r["corpus"], r["length"]) for r in records}
    records += [r for r in (load(earlier) if earlier else []) if (r["corpus"], r["length"]) not in held]
    if not records:
        return []
    out = ["## Whole units on real files (a PyPI package table, Debian's package log, LiteLLM's price table)", "",
           "`python -m ilre.evaluation.real_files` (evaluation/real_files.py): windows of real files, one question about "
           "one row or line, the default strategy at budget 1024 with `granularity` token and unit on the same document. "
           "Cells: answer kept % [95% Wilson] / asked line kept whole % (/ the table's header row kept %, where the "
           "file has one); difference: unit minus token in points with its 95% paired-bootstrap interval.", "",
           "Fell back: the samples where the default read the whole context to l_R (its candidates missed), of "
           "those that say; \"not recorded\": measured before the default had its fallback (stages 20-21).", "",
           "| corpus | length | tokens | units | difference | pairs | fell back |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for corpus in sorted({r["corpus"] for r in records}):
        for length in sorted({r["length"] for r in records if r["corpus"] == corpus}):
            by = {g: {r["index"]: r for r in records if r["corpus"] == corpus and r["length"] == length
                      and r["granularity"] == g} for g in ("token", "unit")}
            keys = sorted(set(by["token"]) & set(by["unit"]))
            if not keys:
                continue
            cells = []
            for g in ("token", "unit"):
                kept = sum(by[g][k]["kept"] for k in keys) / len(keys)
                low, high = wilson(kept, len(keys))
                whole = sum(by[g][k]["line_whole"] for k in keys) / len(keys)
                headers = [by[g][k].get("header_kept") for k in keys]
                header = (f" / {100 * sum(headers) / len(keys):.0f}" if all(h is not None for h in headers) else "")
                cells.append(f"{100 * kept:.0f} [{100 * low:.0f}–{100 * high:.0f}] / {100 * whole:.0f}{header}")
            diff, low, high = paired_difference([(float(by["unit"][k]["kept"]), float(by["token"][k]["kept"])) for k in keys])
            said = [by["unit"][k]["fell_back"] for k in keys if by["unit"][k].get("fell_back") is not None]
            fell = f"{sum(said)} of {len(said)}" if said else "not recorded"
            out.append(f"| {corpus} | {length_label(length)} | {cells[0]} | {cells[1]} | "
                       f"{100 * diff:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}] | {len(keys)} | {fell} |")
    return out + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="16K,32K")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--corpora", default=",".join(SOURCES), help="which corpora, in this order")
    args = parser.parse_args()
    corpora = tuple(args.corpora.split(","))
    unknown = sorted(set(corpora) - set(SOURCES))
    if unknown:
        parser.error(f"--corpora: unknown {', '.join(unknown)} (known: {', '.join(SOURCES)})")
    run_real_files([parse_length(n) for n in args.lengths.split(",")], args.samples, corpora=corpora)
    print("\n".join(section(OUTPUT, EARLIER)))


if __name__ == "__main__":
    main()
