"""`ilre` command line: parses arguments and calls the run_* functions; nothing else lives here."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from ..api.messages import DCA_MODES, InputError
from .output import EXIT_INPUT, CliError, summary


def _placement_options(parser: argparse.ArgumentParser) -> None:
    """--device and --dtype, shared by every command that loads a model (env ILRE_DEVICE, ILRE_DTYPE)."""
    from ...models.device import DEVICE_HELP, DTYPE_CHOICES

    parser.add_argument("--device", default=os.environ.get("ILRE_DEVICE", "auto"),
                        help=f"{DEVICE_HELP}: where the model runs (default auto: a GPU or NPU when present; env ILRE_DEVICE)")
    parser.add_argument("--dtype", default=os.environ.get("ILRE_DTYPE", "auto"),
                        help=f"{', '.join(DTYPE_CHOICES)} (default auto: bfloat16 on GPUs, NPUs and CPUs with native "
                        "bfloat16, else float32; env ILRE_DTYPE)")


def _engine_options(parser: argparse.ArgumentParser) -> None:
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--budget", type=int, help="context tokens to keep, sink included (default 1024)")
    budget.add_argument("--ratio", type=float, help="share of the context tokens to keep, in (0, 1]")
    parser.add_argument("--model", default=None, help="checkpoint folder, .gguf file or hub id (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--layer", type=int, default=None, help="retrieval layer l_R (default: the model's profile)")
    parser.add_argument("--strategy", default=None, help="ilre (default), snapkv, streaming_llm")
    parser.add_argument("--dca", choices=DCA_MODES, default=None, help="dual chunk attention: auto = on beyond the native window")
    parser.add_argument("--sink", type=int, default=4, help="S sink tokens (default 4)")
    parser.add_argument("--window", type=int, default=512, help="W sliding-window tokens below l_R; 0 = unbounded (default 512)")
    parser.add_argument("--chunk", type=int, default=1024, help="prefill chunk length (default 1024)")
    parser.add_argument("--max-context-tokens", type=int, default=int(os.environ.get("ILRE_MAX_CONTEXT_TOKENS", 1 << 20)),
                        help="reject longer contexts (default 1048576, env ILRE_MAX_CONTEXT_TOKENS)")
    _placement_options(parser)
    parser.add_argument("--batch-tokens", type=int, default=os.environ.get("ILRE_BATCH_TOKENS") or None,
                        help="short requests of a queue batch share one prefill, up to this many padded context tokens "
                        "(default: 16384 on GPUs and NPUs, 0 = off on CPUs; env ILRE_BATCH_TOKENS)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ilre", description="Compress long prompts by intermediate layer retrieval.")
    sub = parser.add_subparsers(dest="command", required=True)
    compress = sub.add_parser("compress", help="compress one context for one query")
    source = compress.add_mutually_exclusive_group(required=True)
    source.add_argument("--context", help="the context text")
    source.add_argument("--context-file", help="file holding the context (UTF-8); - for standard input")
    compress.add_argument("--query", required=True, help="question plus answer prefix")
    compress.add_argument("--json", action="store_true", help="print the result as one JSON object")
    _engine_options(compress)
    _remote_options(compress)
    batch = sub.add_parser("batch", help="compress every line of a JSONL file with one loaded model")
    batch.add_argument("--input", required=True, help="JSONL: {id, context, query, optional budget|ratio|strategy}")
    batch.add_argument("--output", required=True, help="JSONL results, one line per input line, same order")
    _engine_options(batch)
    demo = sub.add_parser("demo", help="compress a generated long document with a planted fact and report")
    demo.add_argument("--tokens", type=int, default=16000, help="length of the generated document")
    _engine_options(demo)
    serve = sub.add_parser("serve", help="run the gRPC + HTTP service (in-process queue, or Redis with --redis-url)")
    _service_options(serve)
    _engine_options(serve)
    sidecar = sub.add_parser("sidecar", help="an engine's own HTTP API (SGLang, vLLM/OpenAI, llama.cpp) with long prompts compressed")
    _sidecar_options(sidecar)
    _engine_options(sidecar)
    worker = sub.add_parser("worker", help="serve requests queued on Redis by `ilre serve --redis-url`")
    _queue_options(worker)
    worker.add_argument("--claim-idle-ms", type=int, help="reclaim entries of a worker silent this long (default 30000)")
    worker.add_argument("--max-attempts", type=int, help="deliveries before a request goes to the dead letters (default 3)")
    worker.add_argument("--name", help="consumer name in the group (default host-pid-random)")
    worker.add_argument("--metrics-port", type=int, help="serve this worker's Prometheus metrics on this port")
    worker.add_argument("--host", help="address of --metrics-port (default 127.0.0.1, env ILRE_HOST)")
    _engine_options(worker)
    calibrate = sub.add_parser("calibrate", help="find the model's retrieval layer l_R and write its profile")
    calibrate.add_argument("--model", default=None, help="checkpoint folder, .gguf file or hub id (default: embedded)")
    calibrate.add_argument("--lengths", default=None, help="context lengths, comma-separated (default 2048,6144)")
    calibrate.add_argument("--digits", default=None, help="passkey lengths in digits (default 8,32)")
    calibrate.add_argument("--depths", type=int, default=None, help="needle depths: equal segments (default 20)")
    calibrate.add_argument("--budget", type=int, default=None, help="tokens kept (default 1024)")
    calibrate.add_argument("--quick", action="store_true", help="a small grid for a smoke run")
    calibrate.add_argument("--profile-dir", default=None, help="where to write the profile (default models/profiles)")
    calibrate.add_argument("--plots", default="docs/calibration", help="folder for the heatmaps ('' = none)")
    _placement_options(calibrate)
    evaluate = sub.add_parser("eval", help="RULER-style retention and end-to-end table of every strategy -> docs/results.md")
    evaluate.add_argument("--quick", action="store_true", help="2 tasks x 1 sample x 4K, 4 strategies, short generations (minutes)")
    evaluate.add_argument("--tasks", help="comma-separated RULER tasks (default: all 11)")
    evaluate.add_argument("--lengths", help="comma-separated lengths, e.g. 4K,16K,128K (default 4K..128K)")
    evaluate.add_argument("--strategies", help="comma-separated: full, ilre, ilre_nodca, snapkv, streaming_llm, rag, llmlingua, longllmlingua")
    evaluate.add_argument("--samples", type=int, help="samples per task and length")
    evaluate.add_argument("--budget", type=int, help="context tokens kept by every strategy (default 1024)")
    evaluate.add_argument("--seed", type=int, help="generator seed (default 0)")
    evaluate.add_argument("--no-e2e", action="store_true", help="retention only, no generation")
    evaluate.add_argument("--max-new-tokens", type=int, help="cap on RULER's generation length (0 = RULER's)")
    evaluate.add_argument("--full-max-length", type=int, help="longest length for full-context generation (0 = no cap)")
    evaluate.add_argument("--lingua-max-length", type=int, help="longest length for LLMLingua (0 = no cap)")
    evaluate.add_argument("--model", default=None, help="checkpoint folder, .gguf file or hub id (default: embedded)")
    evaluate.add_argument("--results-dir", help="raw JSONL + meta (default results/eval, results/eval-quick with --quick)")
    evaluate.add_argument("--output", help="the results page (default docs/results.md; with --quick, RESULTS_DIR/results.md)")
    evaluate.add_argument("--report-only", action="store_true", help="only regenerate the page from the raw results")
    evaluate.add_argument("--fresh", action="store_true", help="discard earlier raw results instead of resuming")
    _placement_options(evaluate)
    return parser


def _remote_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", help="HOST:PORT of a running `ilre serve`: compress there instead of loading a model here")
    parser.add_argument("--api-key", help="API key for --server (default env ILRE_API_KEY)")
    parser.add_argument("--tls-ca", help="PEM CA of the server's certificate (turns TLS on)")
    parser.add_argument("--tls-cert", help="PEM client certificate, for mutual TLS")
    parser.add_argument("--tls-key", help="PEM client key, for mutual TLS")
    parser.add_argument("--timeout", type=float, default=300.0, help="deadline of the call in seconds (default 300)")


def _queue_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis-url", help="redis://HOST:PORT/DB: queue on Redis (env ILRE_REDIS_URL)")
    parser.add_argument("--redis-prefix", help="key prefix on Redis (default ilre)")
    parser.add_argument("--max-batch", type=int, help="requests per batch (default 8)")
    parser.add_argument("--max-wait-ms", type=float, help="how long a batch waits to fill up (default 5)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")


def _service_options(parser: argparse.ArgumentParser) -> None:
    """Service settings; each also reads ILRE_<NAME> (see service/config.py), the flag wins."""
    parser.add_argument("--host", help="listen address (default 127.0.0.1; 0.0.0.0 in containers)")
    parser.add_argument("--grpc-port", type=int, help="gRPC port (default 50051; 0 = any free port)")
    parser.add_argument("--http-port", type=int, help="HTTP port: health, metrics, JSON (default 8080)")
    _queue_options(parser)
    parser.add_argument("--max-queue", type=int, help="accepted unfinished requests before RESOURCE_EXHAUSTED (default 256)")
    parser.add_argument("--request-timeout", type=float, help="deadline of requests that bring none, in s (default 300)")
    parser.add_argument("--max-message-bytes", type=int, help="largest gRPC message / HTTP body (default 16 MiB)")
    parser.add_argument("--api-keys-file", help="accepted API keys, one per line (also env ILRE_API_KEYS)")
    parser.add_argument("--tls-cert", help="PEM certificate chain: serve TLS (with --tls-key)")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    parser.add_argument("--tls-client-ca", help="PEM CA of client certificates: mutual TLS")
    parser.add_argument("--shutdown-grace", type=float, help="seconds in-flight calls get on SIGTERM (default 10)")


def _sidecar_options(parser: argparse.ArgumentParser) -> None:
    """Sidecar settings; each also reads ILRE_<NAME> (see SidecarConfig in service/config.py)."""
    from ..config import ENGINE_APIS, FORWARD_MODES

    parser.add_argument("--engine-url", help="the engine's base URL (env ILRE_ENGINE_URL; default http://127.0.0.1:30000)")
    parser.add_argument("--engine-api", choices=ENGINE_APIS, help="the engine's API (env ILRE_ENGINE_API; default sglang; "
                        "openai = vLLM or any OpenAI-compatible server)")
    parser.add_argument("--forward", choices=FORWARD_MODES, help="send the engine token IDs or text; auto = IDs when its "
                        "tokenizer is ours (env ILRE_FORWARD; default auto)")
    parser.add_argument("--engine-timeout", type=float, help="deadline of a request without x-request-timeout: "
                        "compression plus the engine's answer, in s (default 600)")
    parser.add_argument("--connect-timeout", type=float, help="connecting to the engine, in s (default 5)")
    parser.add_argument("--query-tokens", type=int, help="plain prompts: the last N tokens are the query (default 64)")
    parser.add_argument("--host", help="listen address (default 127.0.0.1; 0.0.0.0 in containers)")
    parser.add_argument("--port", type=int, help="listen port (env ILRE_HTTP_PORT; default 8080)")
    _queue_options(parser)
    parser.add_argument("--max-queue", type=int, help="accepted unfinished compressions before 429 (default 256)")
    parser.add_argument("--max-message-bytes", type=int, help="largest request body (default 16 MiB)")
    parser.add_argument("--api-keys-file", help="accepted API keys, one per line (also env ILRE_API_KEYS)")
    parser.add_argument("--tls-cert", help="PEM certificate chain: serve TLS (with --tls-key)")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    parser.add_argument("--shutdown-grace", type=float, help="seconds in-flight requests get on SIGTERM (default 10)")


def _engine(args: argparse.Namespace):
    from ...compressor.prefill import PrefillConfig
    from ..api.engine import Engine, EngineConfig

    try:
        prefill = PrefillConfig(args.sink, args.window or None, args.chunk)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.max_context_tokens < 1:
        raise CliError(f"max-context-tokens: must be >= 1 (got {args.max_context_tokens})")
    if args.batch_tokens is not None and args.batch_tokens < 0:
        raise CliError(f"batch-tokens: must be >= 0 (got {args.batch_tokens})")
    config = EngineConfig(model=args.model, layer=args.layer, prefill=prefill, max_context_tokens=args.max_context_tokens,
                          device=args.device, dtype=args.dtype, batch_tokens=args.batch_tokens)
    try:
        return Engine(config)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        raise CliError(str(exc).strip("'\"")) from None


def request_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """The per-request fields given on the command line (used as defaults by `batch`)."""
    return {"budget": args.budget, "ratio": args.ratio, "strategy": args.strategy, "dca": args.dca}


def read_context(args: argparse.Namespace) -> str:
    """The --context text or the --context-file contents, decoded strictly as UTF-8."""
    if args.context is not None:
        return args.context
    name = args.context_file
    try:
        raw = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
    except FileNotFoundError:
        raise InputError("context-file", f"no such file: {name}") from None
    except IsADirectoryError:
        raise InputError("context-file", f"is a directory: {name}") from None
    except OSError as exc:
        raise InputError("context-file", f"cannot read {name}: {exc.strerror}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError("context-file", f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None


def run_compress(args: argparse.Namespace) -> int:
    from ..api.messages import CompressRequest

    request = CompressRequest.from_json({"context": read_context(args), "query": args.query}, request_defaults(args))
    result = _compress_remote(args, request) if args.server else _engine(args).compress(request)
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False))
    else:
        print(result.compressed_context)
        print(summary(result.to_dict()), file=sys.stderr)
    return 0


def _compress_remote(args: argparse.Namespace, request):
    """`compress --server`: the same request through a running service's gRPC API."""
    import dataclasses

    from ..client import Client, ClientError

    fields = {k: v for k, v in dataclasses.asdict(request).items() if v is not None}
    if args.layer is not None:
        fields["layer"] = args.layer
    tls = {"tls_ca": args.tls_ca, "tls_cert": args.tls_cert, "tls_key": args.tls_key}
    try:
        with Client(args.server, api_key=args.api_key or os.environ.get("ILRE_API_KEY") or None,
                    **{k: v for k, v in tls.items() if v}) as client:
            return client.compress(timeout=args.timeout, **fields)
    except ClientError as exc:
        raise CliError(exc.message if exc.code == "INVALID_ARGUMENT" else f"server {args.server}: {exc}") from None
    except OSError as exc:
        raise CliError(f"tls: cannot read {exc.filename}: {exc.strerror}") from None


def _service_config(args: argparse.Namespace, **settings: Any):
    """ServiceConfig from the environment, the flags winning; CliError naming a bad setting."""
    from ..config import ServiceConfig

    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    names = ("host", "grpc_port", "http_port", "redis_url", "redis_prefix", "max_batch", "max_wait_ms", "max_queue",
             "max_message_bytes", "tls_cert", "tls_key", "tls_client_ca", "claim_idle_ms", "max_attempts")
    flags = {name: getattr(args, name) for name in names if hasattr(args, name)}
    flags.update(request_timeout_s=getattr(args, "request_timeout", None), shutdown_grace_s=getattr(args, "shutdown_grace", None),
                 api_keys_file=getattr(args, "api_keys_file", None))
    try:
        return ServiceConfig.from_env(os.environ, **flags, **settings)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _check_placement(args: argparse.Namespace) -> None:
    """--device / --dtype checked before a server starts (its model loads in the background)."""
    from ...models.device import resolve_placement

    try:
        resolve_placement(args.device, args.dtype)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def run_serve(args: argparse.Namespace) -> int:
    from ..server import run_serve as serve

    _check_placement(args)
    config = _service_config(args, max_context_tokens=args.max_context_tokens)
    try:
        return serve(config, lambda: _engine(args), request_defaults(args))
    except ValueError as exc:  # ConfigError: a port in use, unreadable TLS files
        raise CliError(str(exc)) from None


def run_sidecar(args: argparse.Namespace) -> int:
    from ...models.loader import load_tokenizer, resolve_checkpoint
    from ..config import SidecarConfig
    from ..server import run_serve as serve

    _check_placement(args)
    config = _service_config(args, http_port=args.port, max_context_tokens=args.max_context_tokens)
    try:
        sidecar = SidecarConfig.from_env(os.environ, engine_url=args.engine_url, engine_api=args.engine_api,
                                         forward=args.forward, engine_timeout_s=args.engine_timeout,
                                         connect_timeout_s=args.connect_timeout, query_tokens=args.query_tokens)
        tokenizer = load_tokenizer(resolve_checkpoint(args.model).path)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        raise CliError(str(exc).strip("'\"")) from None
    try:
        return serve(config, lambda: _engine(args), request_defaults(args), sidecar=sidecar, tokenizer=tokenizer)
    except ValueError as exc:  # ConfigError: a port in use, unreadable TLS files
        raise CliError(str(exc)) from None


def run_worker(args: argparse.Namespace) -> int:
    from ..queue.worker import run_worker as work

    config = _service_config(args)
    if not config.redis_url:
        raise CliError("redis-url: a worker needs --redis-url (or ILRE_REDIS_URL)")
    return work(_engine(args), config, name=args.name, metrics_port=args.metrics_port)


def run_batch(args: argparse.Namespace) -> int:
    from .batch import run_batch_file

    return run_batch_file(_engine(args), Path(args.input), Path(args.output), request_defaults(args))


def run_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo_document

    return run_demo_document(_engine(args), args.tokens, request_defaults(args))


def run_calibrate(args: argparse.Namespace) -> int:
    import dataclasses

    from ...evaluation.calibrate import QUICK_PLAN, CalibrationPlan, run_calibration
    from ...models.device import resolve_placement
    from ...models.profiles import PROFILE_DIR

    plan = QUICK_PLAN if args.quick else CalibrationPlan()
    try:
        changes = {name: tuple(int(x) for x in value.split(",") if x.strip())
                   for name, value in (("lengths", args.lengths), ("digits", args.digits)) if value}
    except ValueError:
        raise CliError("lengths/digits: must be comma-separated integers") from None
    changes.update({k: v for k, v in (("depths", args.depths), ("budget", args.budget)) if v is not None})
    plan = dataclasses.replace(plan, **changes)
    if min(plan.lengths + plan.digits) < 1 or plan.depths < 1 or plan.budget < 1:
        raise CliError("lengths, digits, depths, budget: must all be >= 1")
    try:
        placement = resolve_placement(args.device, args.dtype)  # PlacementError is a ValueError
        profile = run_calibration(args.model, plan, Path(args.profile_dir) if args.profile_dir else PROFILE_DIR,
                                  Path(args.plots) if args.plots else None, placement=placement)
    except (FileNotFoundError, ValueError) as exc:
        raise CliError(str(exc)) from None
    print(json.dumps({"model": profile.model, "retrieval_layer": profile.retrieval_layer}))
    return 0


def run_evaluation(args: argparse.Namespace) -> int:
    import dataclasses

    from ...evaluation.results import write_report
    from ...evaluation.ruler import parse_length
    from ...evaluation.run_eval import FULL_PLAN, QUICK_PLAN, run_eval

    _check_placement(args)
    plan = QUICK_PLAN if args.quick else FULL_PLAN
    results_dir = Path(args.results_dir or ("results/eval-quick" if args.quick else "results/eval"))
    output = Path(args.output or (results_dir / "results.md" if args.quick else "docs/results.md"))
    command = _eval_command(args)
    if not args.report_only:
        try:
            changes: dict[str, Any] = {name: tuple(x.strip() for x in value.split(",") if x.strip())
                                       for name, value in (("tasks", args.tasks), ("strategies", args.strategies)) if value}
            if args.lengths:
                changes["lengths"] = tuple(parse_length(x) for x in args.lengths.split(",") if x.strip())
                if not args.quick and max(changes["lengths"]) <= plan.long_from:
                    changes["long_tasks"] = ()
            if args.tasks:
                changes["long_tasks"] = ()
                changes["e2e_tasks"] = ()
            names = ("samples", "budget", "seed", "max_new_tokens", "full_max_length", "lingua_max_length", "model",
                     "device", "dtype")
            changes.update({n: getattr(args, n) for n in names if getattr(args, n) is not None})
            if args.samples is not None:
                changes["long_samples"] = 0
            if args.no_e2e:
                changes["e2e"] = False
            plan = dataclasses.replace(plan, **changes)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        try:
            run_eval(plan, results_dir, fresh=args.fresh, progress=lambda line: print(line, file=sys.stderr, flush=True))
        except (FileNotFoundError, ValueError) as exc:
            raise CliError(str(exc)) from None
    if not (results_dir / "raw.jsonl").is_file():
        raise CliError(f"results-dir: no raw results in {results_dir}")
    print(json.dumps({"report": str(write_report(results_dir, output, command)), "raw": str(results_dir / "raw.jsonl")}))
    return 0


def _eval_command(args: argparse.Namespace) -> str:
    """The `ilre eval` command line equivalent to `args`, quoted on the results page."""
    import shlex

    words = ["ilre", "eval"]
    for name, value in vars(args).items():
        if name == "command" or value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        words += [flag] if value is True else [flag, str(value)]
    return " ".join(shlex.quote(w) for w in words)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    runners = {"compress": run_compress, "batch": run_batch, "demo": run_demo, "serve": run_serve, "sidecar": run_sidecar,
               "worker": run_worker, "calibrate": run_calibrate, "eval": run_evaluation}
    try:
        return runners[args.command](args)
    except (InputError, CliError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug: one line for users, the traceback only on request
        if os.environ.get("ILRE_DEBUG"):
            raise
        print(f"error: internal: {type(exc).__name__}: {exc} (set ILRE_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1

