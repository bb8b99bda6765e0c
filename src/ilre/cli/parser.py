"""The `ilre` argument parser: one subcommand per run_* function of main.py, options grouped by concern."""

from __future__ import annotations

import argparse
import os

from ..compressor.defaults import CHUNK, DEFAULT_STRATEGY, SINK, WINDOW
from ..engine.defaults import AUTO_BATCH_TOKENS, DEFAULT_BUDGET, DOC_CACHE_MB, MAX_CONTEXT_TOKENS, QUERY_TOKENS
from ..engine.messages import DCA_MODES, GRANULARITIES


def _placement_options(parser: argparse.ArgumentParser) -> None:
    """--device and --dtype, shared by every command that loads a model (env ILRE_DEVICE, ILRE_DTYPE)."""
    from ..models.placement_names import DEVICE_HELP, DTYPE_CHOICES

    parser.add_argument("--device", default=os.environ.get("ILRE_DEVICE", "auto"),
                        help=f"{DEVICE_HELP}: where the model runs (default auto: a GPU or NPU when present; env ILRE_DEVICE)")
    parser.add_argument("--dtype", default=os.environ.get("ILRE_DTYPE", "auto"),
                        help=f"{', '.join(DTYPE_CHOICES)} (default auto: bfloat16 on GPUs, NPUs and CPUs with native "
                        "bfloat16, else float32; env ILRE_DTYPE)")


def granularity_arg(value: str) -> str:
    """--granularity (also its ILRE_GRANULARITY default): token or unit."""
    if value not in GRANULARITIES:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(GRANULARITIES)} (got {value!r})")
    return value


def layer_arg(value: str) -> int | str:
    """--layer: a layer number, or a name of the profile's choices (checked when the model is loaded)."""
    return int(value) if value.strip().lstrip("-").isdigit() else value.strip()


def _engine_options(parser: argparse.ArgumentParser) -> None:
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--budget", type=int, help=f"context tokens to keep, sink included (default {DEFAULT_BUDGET})")
    budget.add_argument("--ratio", type=float, help="share of the context tokens to keep, in (0, 1]")
    parser.add_argument("--model", default=None, help="checkpoint folder, .gguf file or hub id (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--layer", type=layer_arg, default=None, help="retrieval layer l_R: a number or a name the model's "
                        "profile offers (fast, default, robust; default: the profile's default)")
    parser.add_argument("--strategy", default=None, help=f"{DEFAULT_STRATEGY} (default: ILRe whose coarse layer picks candidates for l_R), ilre, snapkv, streaming_llm, "
                        "lagkv, reattention, locret, actqkv")
    parser.add_argument("--strategy-options", default=None, metavar="JSON",
                        help='the strategy\'s options as a JSON object, e.g. \'{"lag": 256}\' for lagkv')
    parser.add_argument("--dca", choices=DCA_MODES, default=None, help="dual chunk attention: auto = on beyond the native window")
    parser.add_argument("--granularity", type=granularity_arg, metavar="|".join(GRANULARITIES),
                        default=os.environ.get("ILRE_GRANULARITY") or None,
                        help="keep single tokens, or whole units: sentences, lines, JSON records, messages "
                        "(default: the model's profile, token where it names none; env ILRE_GRANULARITY)")
    parser.add_argument("--sink", type=int, default=SINK, help=f"S sink tokens (default {SINK})")
    parser.add_argument("--window", type=int, default=WINDOW,
                        help=f"W sliding-window tokens below l_R; 0 = unbounded (default {WINDOW})")
    parser.add_argument("--chunk", type=int, default=CHUNK, help=f"prefill chunk length (default {CHUNK})")
    parser.add_argument("--max-context-tokens", type=int, default=int(os.environ.get("ILRE_MAX_CONTEXT_TOKENS", MAX_CONTEXT_TOKENS)),
                        help=f"reject longer contexts (default {MAX_CONTEXT_TOKENS}, env ILRE_MAX_CONTEXT_TOKENS)")
    _placement_options(parser)
    parser.add_argument("--doc-cache-mb", type=int, default=int(os.environ.get("ILRE_DOC_CACHE_MB", DOC_CACHE_MB)),
                        help="in-process document cache: token IDs and encoded contexts reused by later queries of the "
                        f"same document, in MiB (default {DOC_CACHE_MB}, 0 = off; env ILRE_DOC_CACHE_MB)")
    parser.add_argument("--batch-tokens", type=int, default=os.environ.get("ILRE_BATCH_TOKENS") or None,
                        help="short requests of a queue batch share one prefill, up to this many padded context tokens "
                        f"(default: {AUTO_BATCH_TOKENS} on GPUs and NPUs, 0 = off on CPUs; env ILRE_BATCH_TOKENS)")


DEEPEN_MODES = ("idle", "off")


def _deepen_option(parser: argparse.ArgumentParser, default: str) -> None:
    """--deepen of the commands that serve many requests (env ILRE_DEEPEN)."""
    parser.add_argument("--deepen", choices=DEEPEN_MODES, default=os.environ.get("ILRE_DEEPEN") or default,
                        help="idle: while no request waits, encode each asked document in full to l_R, so its later "
                        "queries skip the cascade's candidate pass (README, \"Asking a document many questions\"); "
                        f"off: never (default {default}; env ILRE_DEEPEN)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ilre", description="Compress long prompts by intermediate layer retrieval.")
    sub = parser.add_subparsers(dest="command", required=True)
    compress = sub.add_parser("compress", help="compress one context for one query")
    source = compress.add_mutually_exclusive_group(required=True)
    source.add_argument("--context", help="the context text")
    source.add_argument("--context-file", help="file holding the context (UTF-8); - for standard input")
    source.add_argument("--document-id", help="with --server: a context the service holds, by the document_id a "
                        "result carried")
    compress.add_argument("--query", action="append",
                          help="question plus answer prefix; give it several times to ask several questions of one "
                          "prefill of the context (--json then prints {id, document_id, results}); query-agnostic "
                          "strategies (lagkv) need none")
    compress.add_argument("--json", action="store_true", help="print the result as one JSON object")
    compress.add_argument("--explain", metavar="OUT.html", help="also write a page showing the kept tokens and every "
                          "token's score (one query)")
    _engine_options(compress)
    _remote_options(compress)
    batch = sub.add_parser("batch", help="compress every line of a JSONL file with one loaded model")
    batch.add_argument("--input", required=True,
                       help="JSONL: {id, context, query, optional budget|ratio|strategy|granularity}")
    batch.add_argument("--output", required=True, help="JSONL results, one line per input line, same order")
    _engine_options(batch)
    demo = sub.add_parser("demo", help="compress a generated long document with a planted fact and report")
    demo.add_argument("--tokens", type=int, default=16000, help="length of the generated document")
    _engine_options(demo)
    serve = sub.add_parser("serve", help="run the gRPC + HTTP service (in-process queue, or Redis with --redis-url)")
    _service_options(serve)
    _observability_options(serve)
    _engine_options(serve)
    _deepen_option(serve, "idle")
    sidecar = sub.add_parser("sidecar", help="an engine's own HTTP API (SGLang, vLLM/OpenAI, llama.cpp) with long prompts compressed")
    _sidecar_options(sidecar)
    _observability_options(sidecar)
    _engine_options(sidecar)
    _deepen_option(sidecar, "off")  # each prompt is new (a chat grows): deepening it would only take the device
    worker = sub.add_parser("worker", help="serve requests queued on Redis by `ilre serve --redis-url`")
    _queue_options(worker)
    _observability_options(worker)
    worker.add_argument("--claim-idle-ms", type=int, help="reclaim entries of a worker silent this long (default 30000)")
    worker.add_argument("--max-attempts", type=int, help="deliveries before a request goes to the dead letters (default 3)")
    worker.add_argument("--doc-cache-shared-mb", type=int, help="document cache shared by all workers on Redis, in MiB "
                        "(default 2048, 0 = off; env ILRE_DOC_CACHE_SHARED_MB)")
    worker.add_argument("--doc-cache-ttl", type=int, help="a shared document entry expires this many seconds after its "
                        "last use (default 3600; env ILRE_DOC_CACHE_TTL_S)")
    worker.add_argument("--name", help="consumer name in the group (default host-pid-random)")
    worker.add_argument("--metrics-port", type=int, help="serve this worker's Prometheus metrics on this port")
    worker.add_argument("--host", help="address of --metrics-port (default 127.0.0.1, env ILRE_HOST)")
    _engine_options(worker)
    _deepen_option(worker, "idle")
    calibrate = sub.add_parser("calibrate", help="find the model's retrieval layer l_R and write its profile")
    calibrate.add_argument("--model", default=None, help="checkpoint folder, .gguf file or hub id (default: embedded)")
    calibrate.add_argument("--lengths", default=None, help="context lengths, comma-separated (default 2048,6144)")
    calibrate.add_argument("--digits", default=None, help="passkey lengths in digits (default 8,32)")
    calibrate.add_argument("--depths", type=int, default=None, help="needle depths: equal segments (default 20)")
    calibrate.add_argument("--budget", type=int, default=None, help="tokens kept (default 1024)")
    calibrate.add_argument("--long-lengths", default=None, help="contexts beyond the native window, DCA on, that break "
                           "ties (default 16384,32768; '' = none, the paper's rule alone)")
    calibrate.add_argument("--long-digits", default=None, help="passkey lengths of the long grid (default 8,32)")
    calibrate.add_argument("--long-depths", type=int, default=None, help="needle depths of the long grid (default 5)")
    calibrate.add_argument("--distractors", type=int, default=None, help="other passkeys in each long context (default 100)")
    calibrate.add_argument("--quick", action="store_true", help="a small grid for a smoke run")
    calibrate.add_argument("--profile-dir", default=None, help="where to write the profile (default models/profiles)")
    calibrate.add_argument("--plots", default="docs/calibration", help="folder for the heatmaps ('' = none)")
    _placement_options(calibrate)
    train = sub.add_parser("train-locret", help="fit Locret's retaining head for a layer of the model (CPU, minutes)")
    train.add_argument("--model", default=None, help="checkpoint folder, .gguf file or hub id (default: embedded)")
    train.add_argument("--layer", type=int, default=None, help="the layer whose q/k/v it reads (default: l_R of the profile)")
    train.add_argument("--samples", type=int, default=None, help="training examples: RULER tasks and passkeys (default 320)")
    train.add_argument("--lengths", default=None, help="context lengths of the examples, comma-separated (default 1024,2048,3072)")
    train.add_argument("--hidden", type=int, default=None, help="the head's hidden size d_R (default 512)")
    train.add_argument("--epochs", type=int, default=None, help="passes over the training examples (default 40)")
    train.add_argument("--lr", type=float, default=None, help="AdamW's peak learning rate (default 1e-3)")
    train.add_argument("--alpha", type=float, default=None, help="weight of the adjacent-token smoothness term (default 2.5e-3)")
    train.add_argument("--seed", type=int, default=None, help="seed of the examples, initialisation and order (default 0)")
    train.add_argument("--examples-cache", default=None, metavar="FILE", help="keep the built examples in FILE and reuse "
                       "them while the model, layer and data options match (fits with other --hidden/--epochs/--lr)")
    train.add_argument("--output-dir", default=None, help="where to write the head (default models/profiles, beside the "
                       "profile; another folder is found through env ILRE_LOCRET_DIR)")
    _placement_options(train)
    evaluate = sub.add_parser("eval", help="RULER-style retention and end-to-end table of every strategy -> docs/results.md")
    evaluate.add_argument("--quick", action="store_true", help="2 tasks x 1 sample x 4K, 4 strategies, short generations (minutes)")
    evaluate.add_argument("--tasks", help="comma-separated RULER tasks (default: all 11)")
    evaluate.add_argument("--lengths", help="comma-separated lengths, e.g. 4K,16K,128K (default 4K..128K)")
    evaluate.add_argument("--strategies", help="comma-separated: full, ilre, ilre_nodca, ilre_fast_too, snapkv, lagkv, reattention, locret, actqkv, actqkv_auto, "
                          "streaming_llm, rag, llmlingua, longllmlingua")
    evaluate.add_argument("--samples", type=int, help="samples per task and length")
    evaluate.add_argument("--budget", type=int, help="context tokens kept by every strategy (default 1024)")
    evaluate.add_argument("--seed", type=int, help="generator seed (default 0)")
    evaluate.add_argument("--no-e2e", action="store_true", help="retention only, no generation")
    evaluate.add_argument("--max-new-tokens", type=int, help="cap on RULER's generation length (0 = RULER's)")
    evaluate.add_argument("--full-max-length", type=int, help="longest length for full-context generation (0 = no cap)")
    evaluate.add_argument("--lingua-max-length", type=int, help="longest length for LLMLingua (0 = no cap)")
    evaluate.add_argument("--model", default=None, help="checkpoint folder, .gguf file or hub id (default: embedded)")
    evaluate.add_argument("--layer", type=layer_arg, help="l_R of the attention strategies: a number or a profile choice "
                          "(fast, default, robust; default: the profile's)")
    evaluate.add_argument("--results-dir", help="raw JSONL + meta (default results/eval, results/eval-quick with --quick)")
    evaluate.add_argument("--output", help="the results page (default docs/results.md; with --quick or --results-dir, "
                          "RESULTS_DIR/results.md)")
    evaluate.add_argument("--report-only", action="store_true", help="only regenerate the page from the raw results")
    evaluate.add_argument("--fresh", action="store_true", help="discard earlier raw results instead of resuming")
    evaluate.add_argument("--any-dtype", action="store_true", help="keep records measured in another compressor dtype "
                          "instead of measuring them again (e.g. resuming a bfloat16 run on a CPU without native bfloat16)")
    _placement_options(evaluate)
    return parser


def _remote_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", help="HOST:PORT of a running `ilre serve`: compress there instead of loading a model here")
    parser.add_argument("--api-key", help="API key for --server (default env ILRE_API_KEY)")
    parser.add_argument("--tls-ca", help="PEM CA of the server's certificate (turns TLS on)")
    parser.add_argument("--tls-cert", help="PEM client certificate, for mutual TLS")
    parser.add_argument("--tls-key", help="PEM client key, for mutual TLS")
    parser.add_argument("--timeout", type=float, default=300.0, help="deadline of the call in seconds (default 300)")


def _observability_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-format", choices=("text", "json"), default=os.environ.get("ILRE_LOG_FORMAT", "text"),
                        help="json: one JSON object per log line, and one line per request (env ILRE_LOG_FORMAT)")
    parser.add_argument("--log-level", default=os.environ.get("ILRE_LOG_LEVEL") or None,
                        help="debug, info, warning or error (default: info with json, warning with text; env ILRE_LOG_LEVEL)")
    parser.add_argument("--tracing", choices=("off", "otlp", "console"), default=os.environ.get("ILRE_TRACING", "off"),
                        help="OpenTelemetry spans: otlp exports to OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, console prints "
                             "them (default off; env ILRE_TRACING)")


def _queue_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis-url", help="redis://HOST:PORT/DB, or redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB] "
                        "for a Sentinel-managed master: queue on Redis (env ILRE_REDIS_URL)")
    parser.add_argument("--redis-prefix", help="key prefix on Redis (default ilre)")
    parser.add_argument("--max-batch", type=int, help="requests per batch (default 8)")
    parser.add_argument("--max-wait-ms", type=float, help="how long a batch waits to fill up (default 5)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")


def _service_options(parser: argparse.ArgumentParser) -> None:
    """Service settings; each also reads ILRE_<NAME> (see service/common/config.py), the flag wins."""
    parser.add_argument("--host", help="listen address (default 127.0.0.1; 0.0.0.0 in containers)")
    parser.add_argument("--grpc-port", type=int, help="gRPC port (default 50051; 0 = any free port)")
    parser.add_argument("--http-port", type=int, help="HTTP port: health, metrics, JSON (default 8080)")
    _queue_options(parser)
    parser.add_argument("--max-queue", type=int, help="accepted unfinished requests before RESOURCE_EXHAUSTED (default 256)")
    parser.add_argument("--redis-wait-replicas", type=int, help="replicas that must hold a request before it is accepted "
                        "(Redis WAIT; default 1 with redis+sentinel://, else 0)")
    parser.add_argument("--redis-wait-ms", type=int, help="how long an enqueue waits for those replicas (default 1000)")
    parser.add_argument("--request-timeout", type=float, help="deadline of requests that bring none, in s (default 300)")
    parser.add_argument("--max-message-bytes", type=int, help="largest gRPC message / HTTP body (default 16 MiB)")
    parser.add_argument("--api-keys-file", help="accepted API keys, one per line (also env ILRE_API_KEYS)")
    parser.add_argument("--tls-cert", help="PEM certificate chain: serve TLS (with --tls-key)")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    parser.add_argument("--tls-client-ca", help="PEM CA of client certificates: mutual TLS")
    parser.add_argument("--shutdown-grace", type=float, help="seconds in-flight calls get on SIGTERM (default 10)")
    parser.add_argument("--http-keep-alive", type=float,
                        help="seconds an idle HTTP client connection stays open (default 75)")


def _sidecar_options(parser: argparse.ArgumentParser) -> None:
    """Sidecar settings; each also reads ILRE_<NAME> (see SidecarConfig in service/common/config.py)."""
    from ..service.common.config import ENGINE_APIS, FORWARD_MODES

    parser.add_argument("--engine-url", help="the engine's base URL (env ILRE_ENGINE_URL; default http://127.0.0.1:30000)")
    parser.add_argument("--engine-api", choices=ENGINE_APIS, help="the engine's API (env ILRE_ENGINE_API; default sglang; "
                        "openai = vLLM or any OpenAI-compatible server)")
    parser.add_argument("--forward", choices=FORWARD_MODES, help="send the engine token IDs or text; auto = IDs when its "
                        "tokenizer is ours (env ILRE_FORWARD; default auto)")
    parser.add_argument("--engine-timeout", type=float, help="deadline of a request without x-request-timeout: "
                        "compression plus the engine's answer, in s (default 600)")
    parser.add_argument("--connect-timeout", type=float, help="connecting to the engine, in s (default 5)")
    parser.add_argument("--engine-health-interval", type=float, help="seconds between health checks of the engine; "
                        "/ilre/readyz is ready while the latest one passed (default 5)")
    parser.add_argument("--engine-health-timeout", type=float, help="seconds one health check of the engine may take "
                        "(default 20: SGLang answers its /health after the running batch's next step)")
    parser.add_argument("--query-tokens", type=int, help=f"plain prompts: the last N tokens are the query (default {QUERY_TOKENS})")
    parser.add_argument("--host", help="listen address (default 127.0.0.1; 0.0.0.0 in containers)")
    parser.add_argument("--port", type=int, help="listen port (env ILRE_HTTP_PORT; default 8080)")
    _queue_options(parser)
    parser.add_argument("--max-queue", type=int, help="accepted unfinished compressions before 429 (default 256)")
    parser.add_argument("--max-message-bytes", type=int, help="largest request body (default 16 MiB)")
    parser.add_argument("--api-keys-file", help="accepted API keys, one per line (also env ILRE_API_KEYS)")
    parser.add_argument("--tls-cert", help="PEM certificate chain: serve TLS (with --tls-key)")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    parser.add_argument("--shutdown-grace", type=float, help="seconds in-flight requests get on SIGTERM (default 10)")
    parser.add_argument("--http-keep-alive", type=float,
                        help="seconds an idle HTTP client connection stays open (default 75)")
