"""Structured-data and source-code retrieval tasks, beyond RULER (registered in evaluation/tasks/ruler.py).

RULER's haystacks are prose, repeated noise or needle sentences; what an agent or a RAG pipeline
hands a model is often tool output: many records with the same keys, of which the question asks
one record's field. Six task kinds, one builder each, with ruler.py's builder signature
(cfg, rng, n, offset) -> (context, question, answer_prefix, answers, details), n the number of
haystack units:

- records_jsonl: a `list_jobs` tool's output as JSON Lines, one compact object per line (unit: a record);
- records_json: the same records as one pretty-printed JSON document, {"results": [...], "count": n};
- records_csv: a usage export as CSV with a header row (unit: a row);
- markdown_table: a host inventory as a Markdown table inside a short Markdown page (unit: a row);
- logs: application log lines with a request_id and a duration_ms each (unit: a line);
- code_python: source files of Python's standard library, with `retry_budget_<key> = <value>`
  planted in a function or class body, and three distractor assignments (unit: a source line).

The keys are distinct adjective-noun pairs from the `wonderwords` lists (RULER's "words" keys),
none containing the asked one; the asked fields are 7-digit integers, all distinct in a context,
and every record carries several of them, so only the right record gives the answer, which occurs
once in the context. The asked record is uniform over the records (code: over the function and
class bodies of the included source). Everything random comes from the sample's `random.Random`.
"""

from __future__ import annotations

import ast
import bisect
import csv
import functools
import io
import json
import random
import re
import sysconfig
from datetime import datetime, timedelta
from pathlib import Path

from .words import wonderwords_list

# ---------------------------------------------------------------- shared helpers


@functools.lru_cache(maxsize=None)
def _words(name: str) -> tuple[str, ...]:
    """A wonderwords list (words.wonderwords_list), lower-case single words only."""
    return tuple(w for w in wonderwords_list(name) if re.fullmatch(r"[a-z]+", w))


def _keys(rng: random.Random, n: int, sep: str = "-") -> list[str]:
    """n distinct adjective-noun keys (RULER's words keys), e.g. "brave-harbor"."""
    adjectives, nouns = _words("adjectivelist"), _words("nounlist")
    seen: set[str] = set()
    keys: list[str] = []
    while len(keys) < n:
        key = f"{adjectives[rng.randrange(len(adjectives))]}{sep}{nouns[rng.randrange(len(nouns))]}"
        if key not in seen:
            seen.add(key)
            keys.append(key)
    return keys


def _pick_target(rng: random.Random, keys: list[str], sep: str = "-") -> int:
    """A uniformly random index whose key no other key contains ("red-fox" is inside "tired-fox"):
    such a key is replaced by a fresh one."""
    target = rng.randrange(len(keys))
    joined = "\n".join(keys)
    while joined.count(keys[target]) > 1:
        fresh = _keys(rng, 1, sep)[0]
        if fresh not in keys:
            keys[target] = fresh
            joined = "\n".join(keys)
    return target


class _Numbers:
    """Distinct random 7-digit integers, none occurring in `forbidden` (a text they go into)."""

    def __init__(self, rng: random.Random, forbidden: str = ""):
        self.rng, self.forbidden, self.seen = rng, forbidden, set()

    def __call__(self) -> int:
        while True:
            value = self.rng.randint(10**6, 10**7 - 1)
            if value not in self.seen and (not self.forbidden or str(value) not in self.forbidden):
                self.seen.add(value)
                return value


def _timestamps(rng: random.Random, n: int, step_ms: tuple[int, int]) -> list[datetime]:
    at = datetime(2026, 3, 2) + timedelta(seconds=rng.randrange(20 * 86400))
    out = []
    for _ in range(n):
        at += timedelta(milliseconds=rng.randint(*step_ms))
        out.append(at)
    return out


def _check(context: str, key: str, answer: str) -> None:
    if context.count(answer) != 1 or key not in context:  # the builders guarantee it; a bug otherwise
        raise RuntimeError(f"structured: the answer {answer} occurs {context.count(answer)} times, key {key!r}")


def _depth(index: int, n: int) -> int:
    return round(100 * index / max(n - 1, 1))


# ---------------------------------------------------------------- records: JSON Lines, JSON, CSV, Markdown

OWNERS = ("akumar", "bchen", "cdiaz", "dnovak", "eokafor", "fmartin", "gsato", "hlindqvist", "irossi",
          "jmwangi", "kpatel", "lnguyen", "mgarcia", "nschmidt", "oadeyemi", "pkowalski")
REGIONS = ("us-east-1", "us-east-2", "us-west-2", "eu-west-1", "eu-central-1", "ap-southeast-2",
           "ap-northeast-1", "sa-east-1")
JOB_STATUSES = ("succeeded",) * 5 + ("running", "running", "queued", "failed", "cancelled")
JOB_FIELDS = ("duration_ms", "bytes_processed", "rows_written", "peak_memory_kb")  # 7-digit integers


def _jobs(rng: random.Random, n: int):
    """n `list_jobs` records with the same keys, the asked one's index, and the asked field."""
    keys = _keys(rng, n)
    target = _pick_target(rng, keys)
    number = _Numbers(rng)
    times = _timestamps(rng, n, (200, 90_000))
    records = []
    for key, at in zip(keys, times):
        records.append({
            "id": key,
            "status": rng.choice(JOB_STATUSES),
            "owner": rng.choice(OWNERS),
            "region": rng.choice(REGIONS),
            **{f: number() for f in JOB_FIELDS},
            "retries": rng.choice((0, 0, 0, 0, 1, 1, 2, 3)),
            "updated": f"{at:%Y-%m-%dT%H:%M:%S}Z",
        })
    return records, target, rng.choice(JOB_FIELDS)


def _record_question(field: str, key: str, what: str = "record", key_name: str = "id"):
    return (f"\nQuestion: What is the {field} of the {what} whose {key_name} is {key}?",
            f" Answer: The {field} of {key} is")


def _records_jsonl(cfg, rng: random.Random, n: int, offset: int):
    records, target, field = _jobs(rng, n)
    context = ("Below is the output of the `list_jobs` tool, one JSON record per line.\n"
               + "\n".join(json.dumps(r) for r in records))
    key, answer = records[target]["id"], str(records[target][field])
    _check(context, key, answer)
    question, prefix = _record_question(field, key)
    return context, question, prefix, [answer], {"depths": [_depth(target, n)], "keys": [key], "field": field}


def _records_json(cfg, rng: random.Random, n: int, offset: int):
    records, target, field = _jobs(rng, n)
    context = ("Below is the output of the `list_jobs` tool, a JSON document.\n"
               + json.dumps({"results": records, "count": len(records)}, indent=2))
    key, answer = records[target]["id"], str(records[target][field])
    _check(context, key, answer)
    question, prefix = _record_question(field, key)
    return context, question, prefix, [answer], {"depths": [_depth(target, n)], "keys": [key], "field": field}


TEAMS = ("payments", "search", "growth", "platform", "data", "mobile", "infra", "ml", "support", "identity")
PLANS = ("free", "team", "team", "business", "business", "enterprise")
USAGE_FIELDS = ("cpu_seconds", "storage_bytes", "egress_bytes", "api_calls")  # 7-digit integers


def _records_csv(cfg, rng: random.Random, n: int, offset: int):
    keys = _keys(rng, n)
    target = _pick_target(rng, keys)
    number = _Numbers(rng)
    month = f"2026-{rng.randint(1, 2):02d}"
    header = ["project", "team", "plan", "region", *USAGE_FIELDS, "active_users", "billing_month"]
    rows = [[key, rng.choice(TEAMS), rng.choice(PLANS), rng.choice(REGIONS), *(number() for _ in USAGE_FIELDS),
             rng.randint(1, 4000), month] for key in keys]
    field = rng.choice(USAGE_FIELDS)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    context = (f"Below is the file `usage_{month}.csv`, the monthly usage export with a header row and one "
               "project per row.\n" + buffer.getvalue().rstrip("\n"))
    key, answer = keys[target], str(rows[target][header.index(field)])
    _check(context, key, answer)
    question, prefix = _record_question(field, key, "row", "project")
    return context, question, prefix, [answer], {"depths": [_depth(target, n)], "keys": [key], "field": field}


ROLES = ("web", "api", "api", "worker", "worker", "db-replica", "cache", "queue", "batch", "proxy")
DATACENTERS = ("fra1", "ams3", "nyc1", "nyc3", "sfo2", "sgp1", "lon1", "tor1", "blr1")
OSES = ("ubuntu-22.04", "ubuntu-24.04", "debian-12", "rocky-9", "alpine-3.19")
HOST_STATES = ("ok",) * 6 + ("degraded", "maintenance")
HOST_FIELDS = ("mem_total_kb", "disk_free_kb", "uptime_s", "net_rx_kb")  # 7-digit integers


def _markdown_table(cfg, rng: random.Random, n: int, offset: int):
    keys = _keys(rng, n)
    target = _pick_target(rng, keys)
    number = _Numbers(rng)
    header = ["host", "role", "datacenter", "os", "cpu_cores", *HOST_FIELDS, "load_avg", "status"]
    rows = [[key, rng.choice(ROLES), rng.choice(DATACENTERS), rng.choice(OSES), str(rng.choice((2, 4, 8, 16, 32))),
             *(str(number()) for _ in HOST_FIELDS), f"{rng.uniform(0.01, 12):.2f}", rng.choice(HOST_STATES)]
            for key in keys]
    field = rng.choice(HOST_FIELDS)
    synced = datetime(2026, 3, 1) + timedelta(minutes=rng.randrange(30 * 24 * 60))
    table = "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                      + ["| " + " | ".join(row) + " |" for row in rows])
    context = (
        "Below is a page of the operations wiki.\n\n# Fleet inventory\n\n"
        "This page is generated nightly by `inventory-sync` from the configuration database. It lists every "
        "host of the fleet with its role, its location and the resource figures it reported at its last "
        "check-in: memory, disk and network in kilobytes, uptime in seconds.\n\n"
        f"{table}\n\n_Last sync: {synced:%Y-%m-%d %H:%M} UTC, {n} hosts._"
    )
    key, answer = keys[target], rows[target][header.index(field)]
    _check(context, key, answer)
    question, prefix = _record_question(field, key, "row", "host")
    return context, question, prefix, [answer], {"depths": [_depth(target, n)], "keys": [key], "field": field}


# ---------------------------------------------------------------- logs

SERVICES = {  # service -> routes
    "api-gateway": ("/v1/orders", "/v1/orders/{id}", "/v1/cart", "/v1/checkout", "/v1/products", "/v1/users/me"),
    "orders-svc": ("/internal/orders", "/internal/orders/{id}", "/internal/orders/{id}/items"),
    "auth-svc": ("/oauth/token", "/oauth/introspect", "/v1/sessions"),
    "payments-svc": ("/v1/charges", "/v1/refunds", "/v1/payment-methods"),
    "search-svc": ("/v1/search", "/v1/suggest"),
    "inventory-svc": ("/internal/stock/{id}", "/internal/reservations"),
}
STATUS_CODES = (200,) * 14 + (201, 201, 204, 304, 400, 401, 404, 404, 409, 429, 500, 502, 503)
OTHER_LINES = (  # lines without a request: background work, pools, caches
    "INFO  scheduler job=compact-segments state=started shard={a}",
    "INFO  scheduler job=compact-segments state=finished shard={a} segments={b}",
    "WARN  db-pool pool=primary in_use={a} max=64 wait_ms={b}",
    "DEBUG cache-warmer keys_loaded={b} misses={a}",
    "INFO  kafka-consumer topic=orders.events partition={a} lag={b}",
    "ERROR notifications provider=smtp error=\"connection reset by peer\" attempt={a}",
    "INFO  health-check target=payments-svc status=UP latency_ms={a}",
)


def _logs(cfg, rng: random.Random, n: int, offset: int):
    """n log lines, about 90% of them requests with a request_id and a 7-digit duration_ms."""
    times = _timestamps(rng, n, (1, 400))
    kinds = [rng.random() < 0.9 for _ in range(n)]
    if not any(kinds):
        kinds[0] = True
    keys = _keys(rng, sum(kinds))
    target = _pick_target(rng, keys)
    number = _Numbers(rng)
    lines, k, answer, target_line = [], 0, "", 0
    services = sorted(SERVICES)
    for at, request in zip(times, kinds):
        stamp = f"{at:%Y-%m-%dT%H:%M:%S}.{at.microsecond // 1000:03d}Z"
        if not request:
            lines.append(f"{stamp} " + rng.choice(OTHER_LINES).format(a=rng.randint(1, 60), b=rng.randint(61, 90000)))
            continue
        service = rng.choice(services)
        route = rng.choice(SERVICES[service]).replace("{id}", str(rng.randint(1000, 99999)))
        status = rng.choice(STATUS_CODES)
        level = "ERROR" if status >= 500 else "WARN " if status in (409, 429) else "INFO "
        duration = number()
        if k == target:
            answer, target_line = str(duration), len(lines)
        lines.append(f"{stamp} {level} {service} request_id={keys[k]} route={route} status={status} "
                     f"duration_ms={duration} bytes={rng.randint(0, 250000) if status != 204 else 0}")
        k += 1
    context = ("Below are the most recent lines of the production application log, one event per line.\n"
               + "\n".join(lines))
    key = keys[target]
    _check(context, key, answer)
    question = f"\nQuestion: What is the duration_ms of the request whose request_id is {key}?"
    prefix = f" Answer: The duration_ms of request {key} is"
    return context, question, prefix, [answer], {"depths": [_depth(target_line, n)], "keys": [key],
                                                 "field": "duration_ms"}


# ---------------------------------------------------------------- code: Python's standard library

# pure-Python single-file modules present in every CPython from 3.10 on (none removed by 3.13, none
# turned into a package); the ones missing from an installation are skipped
STDLIB_MODULES = tuple(sorted((
    "abc", "argparse", "ast", "base64", "bdb", "bisect", "bz2", "calendar", "cmd", "code", "codecs", "codeop",
    "colorsys", "compileall", "configparser", "contextlib", "copy", "copyreg", "csv", "dataclasses", "datetime",
    "difflib", "dis", "doctest", "enum", "filecmp", "fileinput", "fnmatch", "fractions", "ftplib", "functools",
    "genericpath", "getopt", "getpass", "gettext", "glob", "graphlib", "gzip", "hashlib", "heapq", "hmac",
    "imaplib", "inspect", "ipaddress", "keyword", "linecache", "locale", "lzma", "mailbox", "mimetypes",
    "modulefinder", "netrc", "ntpath", "numbers", "opcode", "operator", "optparse", "os", "pdb", "pickle",
    "pickletools", "pkgutil", "platform", "plistlib", "poplib", "posixpath", "pprint", "profile", "pstats",
    "pty", "py_compile", "pyclbr", "queue", "quopri", "random", "reprlib", "rlcompleter", "runpy", "sched",
    "secrets", "selectors", "shelve", "shlex", "shutil", "signal", "smtplib", "socket", "socketserver", "ssl",
    "stat", "statistics", "string", "stringprep", "struct", "subprocess", "symtable", "tabnanny", "tarfile",
    "tempfile", "textwrap", "threading", "timeit", "token", "tokenize", "trace", "traceback", "tracemalloc",
    "tty", "types", "typing", "uuid", "warnings", "wave", "weakref", "webbrowser", "zipapp", "zipimport",
)))
CODE_NAME = "retry_budget_"


TRY_TYPES = tuple(getattr(ast, name) for name in ("Try", "TryStar") if hasattr(ast, name))


@functools.lru_cache(maxsize=1)
def _stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


@functools.lru_cache(maxsize=None)
def _stdlib_file(name: str):
    """(lines, cuts, sites, top) of a standard-library module, None when it is absent or unreadable.

    cuts: line counts after which the truncated file still parses (the ends of statements, except
    inside a try body, whose try would lose its except/finally); sites: (line index to insert before,
    indentation) at the start of each def/class body, after its docstring; top: the ends of the
    top-level statements (a fallback for planting when a section has too few bodies).
    """
    path = _stdlib_dir() / f"{name}.py"
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None
    lines = text.replace("\r\n", "\n").split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    cuts: set[int] = set()

    def visit(body):
        for node in body:
            cuts.add(node.end_lineno)
            for part in ("body", "orelse", "finalbody"):
                if part == "body" and isinstance(node, TRY_TYPES):
                    continue
                if isinstance(getattr(node, part, None), list):
                    visit(getattr(node, part))
            for inner in getattr(node, "handlers", ()):
                visit(inner.body)
            for case in getattr(node, "cases", ()):
                visit(case.body)

    visit(tree.body)
    sites = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        first = node.body[0]
        indent = lines[first.lineno - 1][: first.col_offset]
        if first.lineno == node.lineno or indent.strip(" \t") or len(indent) != first.col_offset:
            continue  # a one-line def, or a body that does not start its line
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            sites.append((first.end_lineno, indent))  # after the docstring
        else:
            start = min([first.lineno] + [d.lineno for d in getattr(first, "decorator_list", ())])
            sites.append((start - 1, indent))
    return tuple(lines), tuple(sorted(cuts)), tuple(sorted(sites)), tuple(node.end_lineno for node in tree.body)


def _code_python(cfg, rng: random.Random, n: int, offset: int):
    """n source lines (with the `# file:` lines) of standard-library modules in an rng order, the last
    ones cut after a statement so that every section parses; `retry_budget_<noun> = <7 digits>` planted
    at the start of four def/class bodies, the first one asked."""
    available = [m for m in STDLIB_MODULES if (_stdlib_dir() / f"{m}.py").is_file()]
    sections = []  # [name, lines, def/class body sites, top-level sites]
    used = misses = 0
    for name in rng.sample(available, len(available)):
        if _stdlib_file(name) is None:
            continue
        lines, cuts, sites, top = _stdlib_file(name)
        room = n - used - 1
        keep = len(lines) if len(lines) <= room else (cuts[bisect.bisect_right(cuts, room) - 1]
                                                       if room > 0 and cuts and cuts[0] <= room else 0)
        if keep > 0:
            sections.append([name, list(lines[:keep]), [s for s in sites if s[0] <= keep],
                             [(end, "") for end in top if end <= keep]])
            used += 1 + keep
        else:
            misses += 1
        if n - used < 12 or misses >= 4:  # full; else the next file fills what a long statement left
            break
    if not sections:
        raise ValueError(f"code_python: {n} lines hold no statement")
    places = [(i, index, indent) for i, section in enumerate(sections) for index, indent in section[2]]
    if len(places) < 4:  # too few bodies (a very short context): plant at the top level too
        places += [(i, index, indent) for i, section in enumerate(sections) for index, indent in section[3]]
    chosen = [places[j] for j in rng.sample(range(len(places)), min(4, len(places)))]
    nouns = _words("nounlist")
    names: list[str] = []
    while len(names) < len(chosen):
        noun = rng.choice(nouns)
        if not any(noun.startswith(m) or m.startswith(noun) for m in names):
            names.append(noun)
    number = _Numbers(rng, forbidden="\n".join(line for section in sections for line in section[1]))
    planted = [(place, f"{CODE_NAME}{noun}", str(number())) for place, noun in zip(chosen, names)]
    for (i, index, indent), var, value in sorted(planted, key=lambda p: (p[0][0], p[0][1]), reverse=True):
        sections[i][1].insert(index, f"{indent}{var} = {value}")
    head = "Below are source files of a Python code base, each introduced by a `# file:` comment line.\n"
    context = head + "\n\n".join(f"# file: {name}.py\n" + "\n".join(lines) for name, lines, *_ in sections)
    (_, var, answer) = planted[0]
    line_at = context[: context.index(f"{var} = {answer}")].count("\n")
    _check(context, var, answer)
    question = f"\nQuestion: In the code above, what value is assigned to {var}?"
    prefix = f" Answer: The value assigned to {var} is"
    details = {"depths": [_depth(line_at, context.count("\n") + 1)], "keys": [var],
               "distractors": [v for _, v, _ in planted[1:]], "files": [section[0] for section in sections]}
    return context, question, prefix, [answer], details


BUILDERS = {"records_jsonl": _records_jsonl, "records_json": _records_json, "records_csv": _records_csv,
            "code_python": _code_python, "logs": _logs, "markdown_table": _markdown_table}
UNIT_TOKENS = {  # rough tokens per unit (record, row, line), the sizing loop's first guess
    "records_jsonl": 127.0, "records_json": 140.0, "records_csv": 62.0, "code_python": 10.0, "logs": 70.0,
    "markdown_table": 70.0,
}
