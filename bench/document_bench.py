"""`make bench`: asking one document many questions, and ingesting a million-token document.

1. Through the service (in-process queue, real gRPC on loopback, background deepening on as `ilre serve`
   has it), per document length, twice from a cold cache: the first question (tokenize + prefill + select);
   another question by document_id and another by text (tokenized and hashed again, then a cache hit), then one
   about another subject, each sent as soon as the answer before it arrives (deepening has not begun: their
   candidates start at the coarse layer from the stream the document kept, layers l_c..l_R only, those the
   question before them ran read from its rows), then the seconds of idle time the deepening takes
   (engine/deepening.py); the same 60 s after the first answer, nothing else sent (from the deepened
   encoding where deepening ended by then); speed-ups over the first.
2. 20 questions over one 32K document in one CompressQueries request, against one question (`--lengths ''`
   measures this row alone; `--questions 0` leaves it out).
3. `ilre compress --context-file` of a ~1M-token document in its own process: peak RSS beyond the
   loaded engine (bench/rss_probe.py), and tokens/s against the 128K-token run of the same command.
4. What a cached document costs, per length, for the default and for plain ILRe at l_R: the bytes
   the in-process cache counts, the bytes the shared tier stores (the serialised state and IDs),
   beside the live K/V a later query reads (per layer below the state's top layer min(L, S + W)
   K and V entries, the top layer's keys of all L tokens).
Usage: bench/document_bench.py [--lengths 32768,131072] [--questions 20] [--ingest 131072,1040000]
                               [--cached 300,3000,30000,300000] [--dtype auto]
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


FOLLOW_UPS = (" Question: what is the secret passkey? Answer: the secret passkey is",
              " Remind me, what was the secret passkey? The secret passkey is")
OTHER_SUBJECT = " Who speaks first in the scene above? The first speaker is"  # a follow-up about something else
LATER_S = 60.0  # the later follow-ups: this long after the first answer, the service otherwise idle


def timed(call) -> tuple[float, object]:
    start = time.perf_counter()
    out = call()
    return time.perf_counter() - start, out


def service_rows(lengths: list[int], n_questions: int, deepen: bool = True, dtype: str = "auto") -> list[str]:
    """Per length, twice from a cold cache: the first question, then other questions about the same document by
    document_id and by text, sent as soon as the first answer arrives (deepening has not begun: their candidates
    start at the coarse layer from the stream the document kept), and again LATER_S seconds after the first
    answer with nothing else sent (deepened where it finished by then). deepen=False: `--deepen off`, every question
    on the cascade with its candidates from layer 1 (no stream kept): the path the follow-ups took before."""
    from ilre.engine.engine import Engine, EngineConfig
    from ilre.service.client import Client
    from ilre.service.common.config import ServiceConfig
    from ilre.service.server import ServiceThread

    engine = Engine(EngineConfig(deepen=deepen, dtype=dtype))
    config = ServiceConfig(host="127.0.0.1", grpc_port=0, http_port=0)
    lines = [f"First question, then another by document_id and another by text, sent at once and {LATER_S:.0f} s after "
             f"the first answer ({engine.placement.describe()}, in-process queue, gRPC on loopback, background deepening "
             f"{'on' if deepen else 'off'}); "
             "x = first / follow-up",
             "| context tokens | first s | at once by id s | by text s | another subject s | deepening s | "
             f"{LATER_S:.0f} s later by id s | by text s | another subject s | deepened by then | "
             "needle first / at once / later |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    with ServiceThread(config, engine) as svc, Client(f"127.0.0.1:{svc.grpc_port}", timeout=3600) as client:
        client.compress("warm up " * 300, QUERY, budget=64)
        for length in lengths:
            text, runs = document(length), []
            for wait in (0.0, LATER_S):
                engine.deepening.wait_idle()
                engine.documents.clear()
                spent, finished = engine.deepening.stats.seconds, engine.deepening.stats.finished
                first_s, first = timed(lambda: client.compress(text, QUERY, budget=1024))
                answered = time.perf_counter()
                time.sleep(max(0.0, answered + wait - time.perf_counter()))
                deepened = engine.deepening.stats.finished > finished
                by_id_s, by_id = timed(lambda: client.compress(document_id=first.document_id, query=FOLLOW_UPS[0],
                                                               budget=1024))
                by_text_s, by_text = timed(lambda: client.compress(text, FOLLOW_UPS[1], budget=1024))
                other_s, _ = timed(lambda: client.compress(document_id=first.document_id, query=OTHER_SUBJECT,
                                                           budget=1024))
                engine.deepening.wait_idle()
                runs.append({"first": first_s, "by_id": by_id_s, "by_text": by_text_s, "other": other_s,
                             "deepened": deepened,
                             "deepening": engine.deepening.stats.seconds - spent, "tokens": first.original_tokens,
                             "needles": ["kept" if "83921" in r.compressed_context else "lost" for r in (first, by_id, by_text)]})
            now, later = runs
            first_s = statistics.mean([now["first"], later["first"]])
            lines.append(f"| {now['tokens']} | {first_s:.2f} | {now['by_id']:.2f} ({first_s / now['by_id']:.1f}x) | "
                         f"{now['by_text']:.2f} ({first_s / now['by_text']:.1f}x) | "
                         f"{now['other']:.2f} ({first_s / now['other']:.1f}x) | {now['deepening']:.1f} | "
                         f"{later['by_id']:.3f} ({first_s / later['by_id']:.0f}x) | "
                         f"{later['by_text']:.3f} ({first_s / later['by_text']:.0f}x) | "
                         f"{later['other']:.3f} ({first_s / later['other']:.0f}x) | "
                         f"{'yes' if later['deepened'] else 'no'} | {now['needles'][0]} / "
                         f"{'+'.join(now['needles'][1:])} / {'+'.join(later['needles'][1:])} |")
            print(lines[-1], file=sys.stderr, flush=True)
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
    from ilre.contract.messages import CompressRequest

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
    parser.add_argument("--dtype", default="auto", help="the service's --dtype for the service rows (auto: as `ilre serve` picks it)")
    parser.add_argument("--deepen", choices=("idle", "off"), default="idle",
                        help="the service's --deepen (off: later questions run their candidates from layer 1)")
    parser.add_argument("--ingest", default="131072,1040000", help="document lengths for the ingest run ('' = none)")
    parser.add_argument("--cached", default="300,3000,30000,300000", help="document lengths for the cached bytes ('' = none)")
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",") if x]
    ingest_lengths = [int(x) for x in args.ingest.split(",") if x]
    if ingest_lengths:  # first, while this process holds no model and no threads
        print("\n".join(ingest_rows(ingest_lengths)) + "\n", flush=True)
    if lengths or args.questions:
        print("\n".join(service_rows(lengths, args.questions, args.deepen == "idle", args.dtype)) + "\n", flush=True)
    cached = [int(x) for x in args.cached.split(",") if x]
    if cached:
        print("\n".join(cached_rows(cached)), flush=True)


if __name__ == "__main__":
    main()
