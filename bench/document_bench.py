"""`make bench`: asking one document many questions, and ingesting a million-token document.

1. Through the service (in-process queue, real gRPC on loopback, background deepening on as `ilre serve`
   has it), per document length: the first query (tokenize + prefill + select); the same query again
   at once by document_id (the deepening has just begun: the cascade's candidate pass again); the
   seconds of idle time the deepening then takes (engine/deepening.py); the query by document_id once
   the document is deepened, and by resending the text (tokenized and hashed again, then a cache hit);
   speed-ups over the first.
2. 20 questions over one 32K document in one CompressQueries request, against one question (`--lengths ''`
   measures this row alone; `--questions 0` leaves it out).
3. `ilre compress --context-file` of a ~1M-token document in its own process: peak RSS beyond the
   loaded engine (bench/rss_probe.py), and tokens/s against the 128K-token run of the same command.
4. What a cached document costs, per length, for the default and for plain ILRe at l_R: the bytes
   the in-process cache counts, the bytes the shared tier stores (the serialised state and IDs),
   beside the live K/V a later query reads (per layer below the state's top layer min(L, S + W)
   K and V entries, the top layer's keys of all L tokens).
Usage: bench/document_bench.py [--lengths 32768,131072] [--questions 20] [--ingest 131072,1040000]
                               [--cached 300,3000,30000,300000]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NEEDLE = " The secret passkey is 83921. "
QUERY = " What is the secret passkey? The secret passkey is"


@functools.lru_cache(maxsize=1)
def _haystack_ids() -> tuple[object, list[int]]:
    from ilre.evaluation.tasks.haystack import shakespeare_text
    from ilre.models.loader import load_tokenizer, resolve_checkpoint

    tokenizer = load_tokenizer(resolve_checkpoint(None).path)
    return tokenizer, tokenizer(shakespeare_text(), add_special_tokens=False).input_ids


def document(tokens: int) -> str:
    """About `tokens` tokens of Shakespeare (repeated as needed) with the passkey at 50% depth."""
    tokenizer, ids = _haystack_ids()
    text = tokenizer.decode((ids * (tokens // len(ids) + 1))[:tokens])
    middle = text.rfind(" ", 0, len(text) // 2)
    return text[:middle] + NEEDLE + text[middle + 1:]


def questions(n: int) -> list[str]:
    subjects = ["the secret passkey", "the name of the king", "the colour of the sea", "the hour of the feast",
                "the name of the ship", "the price of the horse", "the name of the fool", "the oldest daughter"]
    return [f" Question {i + 1}: what is {subjects[i % len(subjects)]}? Answer:" for i in range(n)]


def median_of(call, repeats: int = 3) -> tuple[float, object]:
    """(median seconds, last result) of `repeats` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def service_rows(lengths: list[int], n_questions: int) -> list[str]:
    from ilre.engine.engine import Engine, EngineConfig
    from ilre.service.client import Client
    from ilre.service.common.config import ServiceConfig
    from ilre.service.server import ServiceThread

    engine = Engine(EngineConfig(deepen=True))
    config = ServiceConfig(host="127.0.0.1", grpc_port=0, http_port=0)
    lines = ["| context tokens | first query s | again at once s | deepening s | again by document_id s | speed-up | "
             "again by text s | speed-up | needle first / deepened |", "|---|---|---|---|---|---|---|---|---|"]
    with ServiceThread(config, engine) as svc, Client(f"127.0.0.1:{svc.grpc_port}", timeout=3600) as client:
        client.compress("warm up " * 300, QUERY, budget=64)
        for length in lengths:
            text = document(length)
            engine.deepening.wait_idle()
            spent = engine.deepening.stats.seconds  # from here on, every step is this document's
            start = time.perf_counter()
            first = client.compress(text, QUERY, budget=1024)
            first_s = time.perf_counter() - start
            start = time.perf_counter()
            at_once = client.compress(document_id=first.document_id, query=QUERY, budget=1024)
            at_once_s = time.perf_counter() - start
            assert at_once.kept_indices == first.kept_indices  # not deepened yet: the cascade again
            engine.deepening.wait_idle()
            deepening_s = engine.deepening.stats.seconds - spent
            by_id_s, by_id = median_of(lambda: client.compress(document_id=first.document_id, query=QUERY, budget=1024))
            by_text_s, by_text = median_of(lambda: client.compress(text, QUERY, budget=1024))
            assert by_id.kept_indices == by_text.kept_indices
            needles = "/".join("kept" if "83921" in r.compressed_context else "lost" for r in (first, by_id))
            lines.append(f"| {first.original_tokens} | {first_s:.2f} | {at_once_s:.2f} | {deepening_s:.1f} | {by_id_s:.3f} | "
                         f"{first_s / by_id_s:.0f}x | {by_text_s:.3f} | {first_s / by_text_s:.0f}x | {needles} |")
            print(f"  measured {length}", file=sys.stderr, flush=True)
        if n_questions:
            lines += ["", questions_row(engine, client, n_questions)]
    return lines


def questions_row(engine, client, n_questions: int) -> str:
    """`n_questions` questions over one 32K document in one request against one question, both from a cold cache."""
    text, asked = document(32768), questions(n_questions)
    engine.deepening.wait_idle()
    engine.documents.clear()  # nothing cached: both start cold
    start = time.perf_counter()
    one = client.compress(text, asked[0], budget=1024)
    one_s = time.perf_counter() - start
    engine.deepening.wait_idle()
    engine.documents.clear()
    start = time.perf_counter()
    many = client.compress_queries(text, asked, budget=1024)
    many_s = time.perf_counter() - start
    deep = sum(r.fell_back for r in many.results)  # read to l_R once for all (Cascade.query_attention_many)
    return (f"{n_questions} questions over one {one.original_tokens}-token document in one request: {many_s:.2f} s; "
            f"one question: {one_s:.2f} s ({many_s / one_s:.2f}x the time of one, target <= 2x: "
            f"{'met' if many_s <= 2 * one_s else 'NOT met'}); "
            + (f"{deep} of them read the whole context to l_R once" if deep else
               "one candidate pass shared by all questions (the union of their candidates)"))


PROBE = Path(__file__).with_name("rss_probe.py")  # peak RSS beyond the loaded engine


def ingest(tokens: int, folder: Path) -> dict:
    """`ilre compress --context-file` of a document of about `tokens` tokens, in its own process."""
    path = folder / f"doc-{tokens}.txt"
    path.write_text(document(tokens), encoding="utf-8")
    start = time.perf_counter()
    out = subprocess.run([sys.executable, str(PROBE), "compress", "--context-file", str(path), "--query", QUERY,
                          "--budget", "1024", "--json"], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    result = json.loads(out.stdout.strip().splitlines()[-1])
    memory = json.loads(out.stderr.strip().splitlines()[-1])
    path.unlink()
    return {"tokens": result["original_tokens"], "seconds": result["timings_ms"]["total"] / 1000, "wall": wall,
            "beyond_mib": memory["peak_mib"] - memory["loaded_mib"], "loaded_mib": memory["loaded_mib"],
            "needle": "83921" in result["compressed_context"]}


def ingest_rows(lengths: list[int]) -> list[str]:
    lines = ["`ilre compress --context-file`, each in its own process; memory beyond the loaded engine (peak RSS "
             "after loading minus RSS once loaded)",
             "| context tokens | compress s | tokens/s | process wall s | engine loaded MiB | beyond it MiB | "
             "layer-l_R keys MiB | needle |", "|---|---|---|---|---|---|---|---|"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in lengths:
            row = ingest(n, Path(tmp))
            rows.append(row)
            keys = row["tokens"] * 3 * 64 * 2 / 2**20  # kv_heads x head_dim x bfloat16
            lines.append(f"| {row['tokens']} | {row['seconds']:.1f} | {row['tokens'] / row['seconds']:.0f} | "
                         f"{row['wall']:.1f} | {row['loaded_mib']:.0f} | {row['beyond_mib']:.0f} | {keys:.0f} | "
                         f"{'kept' if row['needle'] else 'lost'} |")
            print(lines[-1], file=sys.stderr, flush=True)
    if len(rows) >= 2:
        rates = [r["tokens"] / r["seconds"] for r in rows]
        lines.append(f"throughput at {rows[-1]['tokens']} tokens: {100 * rates[-1] / rates[0]:.0f}% of the rate at "
                     f"{rows[0]['tokens']} tokens")
    return lines


def cached_rows(lengths: list[int]) -> list[str]:
    import torch
    from safetensors.torch import save

    from ilre.engine.documents import DocumentCache
    from ilre.engine.engine import Engine
    from ilre.engine.messages import CompressRequest

    engine = Engine()
    mib = 2 ** 20
    lines = [f"What a cached document costs ({engine.placement.describe()}, budget 64; MiB)",
             "| context tokens | strategy | state | in process | shared tier | live K/V | in process / live |",
             "|---|---|---|---|---|---|---|"]
    for n in lengths:
        for strategy in ("cascade", "ilre"):
            cache = engine.documents = DocumentCache(1 << 40)
            result = engine.compress(CompressRequest(context=document(n), query=QUERY, budget=64, strategy=strategy))
            entry = cache._docs[engine.names.slot('', result.document_id)]
            (key, state), = entry.states.items()
            shared = len(save(state.to_tensors())) + len(save({"ids": entry.ids.to(torch.int32)}))
            spec, config, size = engine.spec, state.config, next(iter(state.keys.values())).element_size()
            per_token = spec.num_kv_heads * spec.head_dim * size
            live = ((max(state.keys) - 1) * min(state.length, config.sink + config.window) * 2 * per_token
                    + len(state.keys) * state.length * per_token)
            lines.append(f"| {state.length} | {strategy} | {key.split('-')[0]}{''.join('-' + p for p in key.split('-')[6:])} | "
                         f"{cache.stats.bytes / mib:.2f} | {shared / mib:.2f} | {live / mib:.2f} | "
                         f"{cache.stats.bytes / live:.2f}x |")
            print(lines[-1], file=sys.stderr, flush=True)
    engine.documents = DocumentCache(0)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="32768,131072", help="document lengths asked twice through the service")
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--ingest", default="131072,1040000", help="document lengths for the ingest run ('' = none)")
    parser.add_argument("--cached", default="300,3000,30000,300000", help="document lengths for the cached bytes ('' = none)")
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",") if x]
    ingest_lengths = [int(x) for x in args.ingest.split(",") if x]
    if ingest_lengths:  # first, while this process holds no model and no threads
        print("\n".join(ingest_rows(ingest_lengths)) + "\n", flush=True)
    if lengths or args.questions:
        print("\n".join(service_rows(lengths, args.questions)) + "\n", flush=True)
    cached = [int(x) for x in args.cached.split(",") if x]
    if cached:
        print("\n".join(cached_rows(cached)), flush=True)


if __name__ == "__main__":
    main()
