"""`ilre` command line: the run_* function of each subcommand (the parser is in parser.py)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from ..contract.messages import InputError
from .output import CliError, EXIT_INPUT, summary
from .parser import build_parser


def _engine(args: argparse.Namespace):
    from ..engine.engine import Engine, EngineConfig
    from .configs import engine_settings

    try:
        return Engine(EngineConfig.from_settings(engine_settings(args)))
    except (FileNotFoundError, KeyError, ValueError) as exc:
        raise CliError(str(exc).strip("'\"")) from None


def request_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """The per-request fields given on the command line (used as defaults by `batch`)."""
    options = None
    if getattr(args, "strategy_options", None):
        try:
            options = json.loads(args.strategy_options)
        except json.JSONDecodeError as exc:
            raise InputError("strategy-options", f"not valid JSON ({exc.msg})") from None
    return {"budget": args.budget, "ratio": args.ratio, "strategy": args.strategy, "dca": args.dca,
            "strategy_options": options, "granularity": args.granularity}


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
    from ..contract.messages import CompressRequest, CompressResult, CompressResults

    if args.document_id is not None and not args.server:
        raise CliError("document-id: names a document cached by a running service: give --server too")
    data: dict[str, Any] = ({"document_id": args.document_id} if args.document_id is not None
                            else {"context": read_context(args)})
    queries = args.query or []
    data.update({"query": queries[0]} if len(queries) == 1 else {"queries": queries} if queries else {})
    if args.explain:
        data["explain"] = True
    request = CompressRequest.from_json(data, request_defaults(args))
    outcome = _compress_remote(args, request) if args.server else _engine(args).run(request)
    if isinstance(outcome, CompressResult):  # the thin client's answer to one query
        outcome = CompressResults.of_one(outcome)
    if args.explain:
        page, outcome.results[0].explanation = outcome.results[0].explanation, None
        try:
            Path(args.explain).write_text(page, encoding="utf-8")
        except OSError as exc:
            raise CliError(f"explain: cannot write {args.explain}: {exc.strerror}") from None
    if args.json:
        print(json.dumps(outcome.to_dict(), ensure_ascii=False))
        return 0
    for result in outcome.results:
        print(result.compressed_context)
        print(summary(result.to_dict()), file=sys.stderr)
    return 0


def _compress_remote(args: argparse.Namespace, request):
    """`compress --server`: the same request through a running service's gRPC API."""
    import dataclasses

    from ..service.client import Client, ClientError

    fields = {k: v for k, v in dataclasses.asdict(request).items() if v is not None}
    if args.layer is not None:
        fields["layer"] = args.layer
    tls = {"tls_ca": args.tls_ca, "tls_cert": args.tls_cert, "tls_key": args.tls_key}
    try:
        with Client(args.server, api_key=args.api_key or os.environ.get("ILRE_API_KEY") or None,
                    **{k: v for k, v in tls.items() if v}) as client:
            if request.multi:
                return client.compress_queries(timeout=args.timeout, **fields)
            return client.compress(timeout=args.timeout, **fields)
    except ClientError as exc:
        raise CliError(exc.message if exc.code == "INVALID_ARGUMENT" else f"server {args.server}: {exc}") from None
    except OSError as exc:
        raise CliError(f"tls: cannot read {exc.filename}: {exc.strerror}") from None


def _server_configs(args: argparse.Namespace):
    """The configs of a server command (cli/configs.py); sets torch's thread count when the command gives one."""
    from .configs import command_configs

    configs = command_configs(args)
    if configs.service.threads:
        import torch

        torch.set_num_threads(configs.service.threads)
    return configs


def run_print_settings(args: argparse.Namespace) -> int:
    """`serve|sidecar|worker --print-settings`: the effective settings as JSON, checked as starting checks them;
    nothing else runs (no model, no logging or tracing set up)."""
    from .configs import command_configs, printed_settings

    printed = printed_settings(args, command_configs(args))
    if hasattr(args, "dtype") and hasattr(args, "device"):  # a command that runs the model: which C kernels run
        from ..kernels.native_status import kernel_status
        from ..models.device import resolve_placement

        placement = resolve_placement(args.device, args.dtype)
        printed["kernels"] = kernel_status(placement.dtype) if placement.device.type == "cpu" else {}
    print(json.dumps(printed, indent=2))
    return 0


def _check_placement(args: argparse.Namespace) -> None:
    """--device / --dtype checked before a server starts (its model loads in the background)."""
    from ..models.device import resolve_placement

    try:
        resolve_placement(args.device, args.dtype)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _observed(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A server command with the process's log format and tracing set up first (and flushed after)."""
    def runner(args: argparse.Namespace) -> int:
        from ..service.common.request_log import configure_logging
        from ..service.common.tracing import setup_tracing, shutdown_tracing

        try:
            configure_logging(args.log_format, args.log_level)
            setup_tracing(args.tracing, f"ilre-{args.command}")
        except ValueError as exc:
            raise CliError(str(exc)) from None
        try:
            return run(args)
        finally:
            shutdown_tracing()
    return runner


def run_serve(args: argparse.Namespace) -> int:
    configs = _server_configs(args)
    from ..service.server import run_serve as serve

    with _closing_engines(args) as engine:
        try:
            return serve(configs.service, engine, request_defaults(args))
        except ValueError as exc:  # ConfigError: a port in use, unreadable TLS files
            raise CliError(str(exc)) from None


@contextlib.contextmanager
def _closing_engines(args: argparse.Namespace) -> Iterator[Callable[[], Any]]:
    """A loader of the command's engine (a server loads it in the background) whose engines are closed
    (their background deepening stopped) when the command ends. A server or a batch job runs for long: glibc
    is tuned for it first (engine/heap.py; a one-shot command keeps glibc's defaults)."""
    from ..engine.heap import tune_allocator

    engines: list[Any] = []

    def load():
        tune_allocator()
        engines.append(_engine(args))
        return engines[-1]

    try:
        yield load
    finally:
        for engine in engines:
            engine.close()


def run_sidecar(args: argparse.Namespace) -> int:
    configs = _server_configs(args)
    from ..models.loader import load_tokenizer, resolve_checkpoint
    from ..service.server import run_serve as serve

    try:
        tokenizer = load_tokenizer(resolve_checkpoint(args.model).path)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        raise CliError(str(exc).strip("'\"")) from None
    with _closing_engines(args) as engine:
        try:
            return serve(configs.service, engine, request_defaults(args), sidecar=configs.sidecar, tokenizer=tokenizer)
        except ValueError as exc:  # ConfigError: a port in use, unreadable TLS files
            raise CliError(str(exc)) from None


def run_worker(args: argparse.Namespace) -> int:
    configs = _server_configs(args)
    from ..service.worker import run_worker as work

    config = configs.service
    with _closing_engines(args) as engine:
        return work(engine(), config, name=config.worker_name, metrics_port=config.metrics_port)


def run_batch(args: argparse.Namespace) -> int:
    from .batch import run_batch as run

    with _closing_engines(args) as engine:  # a corpus job runs for long, as a server does
        return run(args, request_defaults(args), engine)


def run_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo_document

    return run_demo_document(_engine(args), args.tokens, request_defaults(args))


def _require_eval_extra(command: str, modules: tuple[str, ...] | None = None) -> None:
    from ..evaluation.extra import EVAL_MODULES, MissingExtra, require_eval_extra

    try:
        require_eval_extra(command, modules or EVAL_MODULES)
    except MissingExtra as exc:
        raise CliError(str(exc)) from None


def run_calibrate(args: argparse.Namespace) -> int:
    import dataclasses

    if args.plots:
        _require_eval_extra("calibrate --plots", ("matplotlib",))
    from ..models.device import resolve_placement
    from ..models.profiles import PROFILE_DIR
    from ..training.calibrate import QUICK_PLAN, CalibrationPlan, run_calibration

    plan = QUICK_PLAN if args.quick else CalibrationPlan()
    lists = (("lengths", args.lengths), ("digits", args.digits), ("long_lengths", args.long_lengths),
             ("long_digits", args.long_digits))
    try:
        changes = {name: tuple(int(x) for x in value.split(",") if x.strip()) for name, value in lists
                   if value is not None and (value or name == "long_lengths")}
    except ValueError:
        raise CliError("lengths/digits/long-lengths/long-digits: must be comma-separated integers") from None
    changes.update({k: v for k, v in (("depths", args.depths), ("budget", args.budget), ("long_depths", args.long_depths),
                                      ("distractors", args.distractors)) if v is not None})
    plan = dataclasses.replace(plan, **changes)
    if (not plan.lengths or min(plan.lengths + plan.digits + plan.long_lengths + plan.long_digits) < 1
            or plan.depths < 1 or plan.long_depths < 1 or plan.budget < 1 or plan.distractors < 0):
        raise CliError("lengths, digits, depths, budget (and their long-grid versions): must all be >= 1; "
                       "distractors >= 0")
    try:
        placement = resolve_placement(args.device, args.dtype)  # PlacementError is a ValueError
        profile = run_calibration(args.model, plan, Path(args.profile_dir) if args.profile_dir else PROFILE_DIR,
                                  Path(args.plots) if args.plots else None, placement=placement)
    except (FileNotFoundError, ValueError) as exc:
        raise CliError(str(exc)) from None
    print(json.dumps({"model": profile.model, "retrieval_layer": profile.retrieval_layer, "choices": profile.choices}))
    return 0


def run_train_locret(args: argparse.Namespace) -> int:
    import dataclasses
    import shlex

    _require_eval_extra("train-locret", ("wonderwords",))
    from ..models.profiles import PROFILE_DIR
    from ..training.locret_data import DataPlan
    from ..training.train_locret import TrainPlan, train_locret

    try:
        data = {k: v for k, v in (("samples", args.samples), ("seed", args.seed)) if v is not None}
        if args.lengths:
            data["lengths"] = tuple(int(x) for x in args.lengths.split(",") if x.strip())
        fit = {k: v for k, v in (("hidden", args.hidden), ("epochs", args.epochs), ("lr", args.lr),
                                 ("alpha", args.alpha), ("seed", args.seed)) if v is not None}
        plan = TrainPlan(data=dataclasses.replace(DataPlan(), **data), **fit)
        command = "ilre " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        path = train_locret(args.model, args.layer, plan, Path(args.output_dir) if args.output_dir else PROFILE_DIR,
                            args.device, args.dtype, command,
                            report=lambda row: print(json.dumps(row), file=sys.stderr, flush=True),
                            cache=Path(args.examples_cache) if args.examples_cache else None)
    except (FileNotFoundError, ValueError) as exc:
        raise CliError(str(exc)) from None
    print(json.dumps({"head": str(path)}))
    return 0


def run_evaluation(args: argparse.Namespace) -> int:
    import dataclasses

    _require_eval_extra("eval")
    from ..evaluation.report.page import write_report
    from ..evaluation.running.plan import FULL_PLAN, QUICK_PLAN
    from ..evaluation.running.run_eval import run_eval
    from ..evaluation.tasks.lengths import parse_length

    _check_placement(args)
    plan = QUICK_PLAN if args.quick else FULL_PLAN
    results_dir = Path(args.results_dir or ("results/eval-quick" if args.quick else "results/eval"))
    own_dir = args.quick or args.results_dir is not None  # a page of its own beside its raw results
    output = Path(args.output or (results_dir / "results.md" if own_dir else "docs/results.md"))
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
            names = ("samples", "budget", "seed", "max_new_tokens", "full_max_length", "lingua_max_length", "model", "layer",
                     "device", "dtype")
            changes.update({n: getattr(args, n) for n in names if getattr(args, n) is not None})
            if args.samples is not None:
                changes["long_samples"] = 0
            if args.no_e2e:
                changes["e2e"] = False
            if args.any_dtype:
                changes["any_dtype"] = True
            plan = dataclasses.replace(plan, **changes)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        try:
            run_eval(plan, results_dir, fresh=args.fresh, progress=lambda line: print(line, file=sys.stderr, flush=True))
        except (FileNotFoundError, ValueError) as exc:
            raise CliError(str(exc)) from None
    if not (results_dir / "raw.jsonl").is_file():
        raise CliError(f"results-dir: no raw results in {results_dir}")
    beside = tuple(Path(folder) for folder in args.beside or ())
    for folder in beside:
        if not (folder / "raw.jsonl").is_file():
            raise CliError(f"beside: no raw results in {folder}")
    page = write_report(results_dir, output, command, beside)
    print(json.dumps({"report": str(page), "raw": str(results_dir / "raw.jsonl")}))
    return 0


def _eval_command(args: argparse.Namespace) -> str:
    """The `ilre eval` command line equivalent to `args`, quoted on the results page."""
    import shlex

    words = ["ilre", "eval"]
    for name, value in vars(args).items():
        if name == "command" or value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        for one in value if isinstance(value, list) else [value]:
            words += [flag] if one is True else [flag, str(one)]
    return " ".join(shlex.quote(w) for w in words)


# top-level modules of the `server` extra (pyproject.toml): missing in a thin install
SERVER_MODULES = ("torch", "transformers", "safetensors", "tokenizers", "gguf", "accelerate", "numpy", "tqdm", "redis",
                  "starlette", "uvicorn", "prometheus_client", "opentelemetry", "grpc_health", "grpc_reflection")


def main(argv: list[str] | None = None) -> int:
    from ..contract.settings import SettingError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        args = build_parser().parse_args(argv)
    except SettingError as exc:  # a setting out of bounds, from a flag or the environment
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    runners = {"compress": run_compress, "batch": run_batch, "demo": run_demo, "serve": _observed(run_serve),
               "sidecar": _observed(run_sidecar), "worker": _observed(run_worker), "calibrate": run_calibrate, "eval": run_evaluation,
               "train-locret": run_train_locret}
    if getattr(args, "print_settings", False):
        runners[args.command] = run_print_settings
    try:
        return runners[args.command](args)
    except (InputError, CliError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug: one line for users, the traceback only on request
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] in SERVER_MODULES:
            where = " without --server" if args.command == "compress" else ""  # a thin install (`pip install ilre`)
            print(f"error: {args.command}{where}: runs the model here and needs the `server` extra "
                  f"(missing: {exc.name}): pip install 'ilre[server]'", file=sys.stderr)
            return EXIT_INPUT
        if os.environ.get("ILRE_DEBUG"):
            raise
        print(f"error: internal: {type(exc).__name__}: {exc} (set ILRE_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1

