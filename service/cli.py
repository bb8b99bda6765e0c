"""`ilre` command line: parses arguments and calls the run_* functions; nothing else lives here."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from .messages import DCA_MODES, InputError

EXIT_INPUT = 2


class CliError(Exception):
    """A run that cannot proceed: printed as one line, exit status EXIT_INPUT."""


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
    batch = sub.add_parser("batch", help="compress every line of a JSONL file with one loaded model")
    batch.add_argument("--input", required=True, help="JSONL: {id, context, query, optional budget|ratio|strategy}")
    batch.add_argument("--output", required=True, help="JSONL results, one line per input line, same order")
    _engine_options(batch)
    demo = sub.add_parser("demo", help="compress a generated long document with a planted fact and report")
    demo.add_argument("--tokens", type=int, default=16000, help="length of the generated document")
    _engine_options(demo)
    return parser


def _engine(args: argparse.Namespace):
    from ..compressor.prefill import PrefillConfig
    from .engine import Engine, EngineConfig

    try:
        prefill = PrefillConfig(args.sink, args.window or None, args.chunk)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.max_context_tokens < 1:
        raise CliError(f"max-context-tokens: must be >= 1 (got {args.max_context_tokens})")
    config = EngineConfig(model=args.model, layer=args.layer, prefill=prefill, max_context_tokens=args.max_context_tokens)
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
    from .messages import CompressRequest

    request = CompressRequest.from_json({"context": read_context(args), "query": args.query}, request_defaults(args))
    result = _engine(args).compress(request)
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False))
    else:
        print(result.compressed_context)
        print(summary(result.to_dict()), file=sys.stderr)
    return 0


def summary(result: dict[str, Any]) -> str:
    """One line for people: what was kept, how, and how long it took."""
    return (f"kept {result['compressed_tokens']} of {result['original_tokens']} context tokens "
            f"({100 * result['ratio']:.1f}%) with {result['strategy']} at layer {result['layer']} of "
            f"{result['model']}{' with DCA' if result['dca'] else ''} in {result['timings_ms']['total'] / 1000:.2f} s")


def run_batch(args: argparse.Namespace) -> int:
    from .batch import run_batch_file

    return run_batch_file(_engine(args), Path(args.input), Path(args.output), request_defaults(args))


def run_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo_document

    return run_demo_document(_engine(args), args.tokens, request_defaults(args))


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    runners = {"compress": run_compress, "batch": run_batch, "demo": run_demo}
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


if __name__ == "__main__":
    sys.exit(main())
