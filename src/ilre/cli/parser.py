"""The `ilre` argument parser: one subcommand per run_* function of main.py, options grouped by concern."""

from __future__ import annotations

import argparse
import os

from typing import Any, Sequence

from ..contract.settings import Setting, SettingError, read_settings, settings_for
from ..engine.engine_settings import EngineSettings, layer_value
from ..service.common.config import ServiceConfig, SidecarConfig

# the declared settings (contract/settings.py) of each command: its flags, environment names and checks
COMMAND_SETTINGS: dict[str, tuple[type, ...]] = {
    "compress": (EngineSettings,), "batch": (EngineSettings,), "demo": (EngineSettings,),
    "serve": (ServiceConfig, EngineSettings), "sidecar": (SidecarConfig, ServiceConfig, EngineSettings),
    "worker": (ServiceConfig, EngineSettings),
}


class SettingsParser(argparse.ArgumentParser):
    """An ArgumentParser whose namespace holds every declared setting of the chosen command resolved: the
    flag when given, else `ILRE_<NAME>`, else the command's default. A value out of bounds raises
    SettingError naming the setting (and the variable it came from): `main` prints it as one line."""

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None):  # type: ignore[override]
        namespace, rest = super().parse_known_args(args, namespace)
        command = getattr(namespace, "command", None)
        if self.prog == "ilre" and command in COMMAND_SETTINGS:
            settings = settings_for(command, *COMMAND_SETTINGS[command])
            sources: dict[str, str] = {}
            values = read_settings(settings, os.environ, vars(namespace), command, sources=sources)
            for name, value in values.items():
                setattr(namespace, name, value)
            namespace.setting_sources = sources
        return namespace, rest


def _flag_value(setting: Setting):
    """argparse's type for the setting's flag: the value of its text, one of its choices (a usage error naming
    the flag); its bounds are checked once resolved (SettingsParser)."""
    def value(text: str) -> Any:
        try:
            parsed = setting.from_text(text)
        except SettingError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if setting.choices and parsed not in setting.choices:
            raise argparse.ArgumentTypeError(setting.problem(parsed))
        return parsed
    value.__name__ = setting.name
    return value


def setting_help(setting: Setting, command: str) -> str:
    """A flag's help line: the setting's help, its default and its environment variable."""
    default = "" if setting.secret else f"default {setting.described_default(command)}; "
    return f"{setting.help} ({default}env {setting.env})"


def add_setting_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """The flags of every declared setting of `command` (COMMAND_SETTINGS), advanced ones in a group of their
    own; each flag's default is None (not given): SettingsParser resolves it."""
    advanced = parser.add_argument_group("advanced settings")
    exclusive: dict[str, Any] = {}
    for setting in settings_for(command, *COMMAND_SETTINGS[command]):
        flag = setting.flag_of(command)
        if flag is None:
            continue
        group: Any = advanced if setting.advanced else parser
        if setting.exclusive:
            if setting.exclusive not in exclusive:
                exclusive[setting.exclusive] = group.add_mutually_exclusive_group()
            group = exclusive[setting.exclusive]
        metavar = setting.metavar or ("|".join(setting.choices) if setting.choices
                                      else flag.lstrip("-").upper().replace("-", "_"))
        group.add_argument(flag, dest=setting.name, type=_flag_value(setting), default=None, metavar=metavar,
                           help=setting_help(setting, command))


def _placement_options(parser: argparse.ArgumentParser) -> None:
    """--device and --dtype of the tools that load a model outside the declared commands (env ILRE_DEVICE, ILRE_DTYPE)."""
    for name in ("device", "dtype"):
        setting = next(s for s in settings_for("compress", EngineSettings) if s.name == name)
        parser.add_argument(f"--{name}", default=os.environ.get(setting.env) or setting.default,
                            help=setting_help(setting, "compress"))


def build_parser() -> argparse.ArgumentParser:
    parser = SettingsParser(prog="ilre", description="Compress long prompts by intermediate layer retrieval.")
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
    add_setting_flags(compress, "compress")
    _remote_options(compress)
    batch = sub.add_parser("batch", help="compress every line of a JSONL file: a resumable corpus job")
    batch.add_argument("--input", required=True,
                       help="JSONL (- = standard input, .gz read as gzip): ilre lines {id, context, query, optional "
                            "budget|ratio|strategy|granularity} or OpenAI batch requests {custom_id, method, url, body}")
    batch.add_argument("--output", required=True, help="JSONL results, one line per input line, same order (- = "
                       "standard output, .gz written as gzip); run again after an interruption, the job goes on")
    batch.add_argument("--errors", help="OpenAI batch lines that cannot be compressed, in the Batch API's error shape "
                       "(default: beside the output, NAME.errors.jsonl)")
    batch.add_argument("--pass-errors", action="store_true", help="write OpenAI batch lines that cannot be "
                       "compressed to the output unchanged instead (counted in the summary)")
    batch.add_argument("--restart", action="store_true", help="start over: forget what earlier runs wrote")
    batch.add_argument("--in-flight", type=_positive, default=16, help="lines compressed at once (default 16)")
    batch.add_argument("--max-line-bytes", type=_positive, default=64 << 20, help="a longer input line is not read "
                       "whole: it becomes its error line (default 67108864: 64 MiB)")
    batch.add_argument("--server", action="append", help="a running `ilre serve` to compress on: http(s)://HOST:PORT "
                       "(its JSON mirror) or HOST:PORT (gRPC); repeat it for several (round robin)")
    batch.add_argument("--redis-url", help="the Redis queue of a worker pool (`ilre worker` processes): compress there")
    batch.add_argument("--redis-prefix", default="ilre", help="the queue's key prefix (default ilre)")
    batch.add_argument("--api-key", help="API key for --server (default env ILRE_API_KEY)")
    batch.add_argument("--timeout", type=float, default=300.0, help="deadline of one request in seconds (default 300)")
    batch.add_argument("--retry-s", type=float, default=300.0, help="how long a refused request (a restart, a "
                       "failover) is sent again before the run stops (default 300)")
    batch.add_argument("--json", action="store_true", help="also print the summary as one JSON object")
    add_setting_flags(batch, "batch")
    demo = sub.add_parser("demo", help="compress a generated long document with a planted fact and report")
    demo.add_argument("--tokens", type=int, default=16000, help="length of the generated document")
    add_setting_flags(demo, "demo")
    servers = (("serve", "run the gRPC + HTTP service (in-process queue, or Redis with --redis-url)"),
               ("sidecar", "an engine's own HTTP API (SGLang, vLLM/OpenAI, llama.cpp) with long prompts compressed"),
               ("worker", "serve requests queued on Redis by `ilre serve --redis-url`"))
    for command, help in servers:
        server = sub.add_parser(command, help=help)
        server.add_argument("--print-settings", action="store_true", help="print the effective settings as JSON "
                            "(each with its source: flag, environment or default; secrets as set/unset), checked as "
                            "starting checks them, and exit without loading a model")
        add_setting_flags(server, command)
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
    evaluate.add_argument("--layer", type=layer_value, help="l_R of the attention strategies: a number or a profile choice "
                          "(fast, default, robust; default: the profile's)")
    evaluate.add_argument("--results-dir", help="raw JSONL + meta (default results/eval, results/eval-quick with --quick)")
    evaluate.add_argument("--output", help="the results page (default docs/results.md; with --quick or --results-dir, "
                          "RESULTS_DIR/results.md)")
    evaluate.add_argument("--report-only", action="store_true", help="only regenerate the page from the raw results")
    evaluate.add_argument("--beside", action="append", metavar="DIR", help="another model's results folder: the page sets "
                          "its default beside this run's, per length and task with intervals (repeatable)")
    evaluate.add_argument("--fresh", action="store_true", help="discard earlier raw results instead of resuming")
    evaluate.add_argument("--any-dtype", action="store_true", help="keep records measured in another compressor dtype "
                          "instead of measuring them again (e.g. resuming a bfloat16 run on a CPU without native bfloat16)")
    _placement_options(evaluate)
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (got {text})")
    return value


def _remote_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", help="HOST:PORT of a running `ilre serve`: compress there instead of loading a model here")
    parser.add_argument("--api-key", help="API key for --server (default env ILRE_API_KEY)")
    parser.add_argument("--tls-ca", help="PEM CA of the server's certificate (turns TLS on)")
    parser.add_argument("--tls-cert", help="PEM client certificate, for mutual TLS")
    parser.add_argument("--tls-key", help="PEM client key, for mutual TLS")
    parser.add_argument("--timeout", type=float, default=300.0, help="deadline of the call in seconds (default 300)")
