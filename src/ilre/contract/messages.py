"""Every message that crosses a boundary: a compression request, its result, and input errors.

A request arrives as a JSON object (a batch line, the HTTP API's body, or the gRPC message converted)
and is validated here once, so every transport reports bad input the same way: field name and limit.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from .defaults import DEFAULT_STRATEGY
from .defaults import MAX_DOCUMENTS, MAX_QUERIES
from .document_ids import DOCUMENT_ID_CHARS, HASH_CHARS, is_document_id

DCA_MODES = ("auto", "on", "off")
GRANULARITIES = ("token", "unit")  # keep single tokens, or whole units (sentences, lines, records: compressor/units.py)



class InputError(ValueError):
    """Bad input: `field` names the offending request field, the message states the limit."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name

    @classmethod
    def from_error(cls, exc: Exception, fallback_field: str) -> "InputError":
        """An error whose text reads "field: message" (the compressor's convention), or all of it under
        `fallback_field` when it names no field."""
        field_name, _, message = str(exc).partition(": ")
        return cls(field_name, message) if message else cls(fallback_field, str(exc))


    @classmethod
    def from_option_error(cls, exc: Exception) -> "InputError":
        """A strategy's error ("max_kernels: ...") under the option's full path in the request
        (`strategy_options.max_kernels`); errors about the strategy itself keep their field."""
        error = cls.from_error(exc, "strategy_options")
        if error.field in ("strategy", "strategy_options") or error.field.startswith("strategy_options."):
            return error
        return cls(f"strategy_options.{error.field}", str(error).partition(": ")[2])


class NotFoundError(InputError):
    """A request names something the service does not hold (an unknown or evicted document_id)."""


@dataclass(frozen=True)
class CompressRequest:
    """One compression job. Exactly one of context / context_ids / document_id (a context sent
    earlier, by the id its result carried); exactly one of query / query_ids or of queries /
    queries_ids (several queries against one prefill of the context, one result each); at most
    one of budget (context tokens kept, sink included) / ratio (kept share of the context). A
    strategy that does not read the query (e.g. lagkv) may be sent none.

    document_ids (instead of a context): one question asked of several documents sent earlier (a conversation's
    messages, in order), one result each, each with its own budget (`budgets`, one per document; or `ratio`, or
    the default): the question runs once, after the last of them, and is moved to each
    (compressor/shared_query.py)."""

    id: str | None = None
    context: str | None = None
    context_ids: list[int] | None = None
    query: str | None = None
    query_ids: list[int] | None = None
    document_id: str | None = None
    queries: list[str] | None = None
    queries_ids: list[list[int]] | None = None
    explain: bool = False  # the result carries an HTML page showing why each token was kept
    budget: int | None = None
    ratio: float | None = None
    strategy: str = DEFAULT_STRATEGY  # ILRe as a cascade (plain ILRe where the profile names no coarse layer)
    strategy_options: dict[str, Any] = field(default_factory=dict)
    dca: str = "auto"
    layer: int | str | None = None  # a layer number, or a name the model's profile offers (fast, default, robust)
    granularity: str | None = None  # "token" or "unit"; None = the model profile's (token where it names none)
    document_ids: list[str] | None = None  # several documents sent earlier, one question for all (one result each)
    budgets: list[int] | None = None  # with document_ids: each document's budget

    def __post_init__(self) -> None:
        self._check_context()
        self._check_queries()
        if self.budget is not None and self.ratio is not None:
            raise InputError("budget", "give either budget or ratio, not both")
        if self.budget is not None and (not _is_int(self.budget) or self.budget <= 0):
            raise InputError("budget", f"must be a positive integer (got {self.budget!r})")
        if self.ratio is not None and (
            isinstance(self.ratio, bool) or not isinstance(self.ratio, (int, float))
            or not math.isfinite(self.ratio) or not 0 < self.ratio <= 1
        ):
            raise InputError("ratio", f"must be a number in (0, 1] (got {self.ratio!r})")
        if not isinstance(self.strategy, str) or not self.strategy:
            raise InputError("strategy", f"must be a strategy name (got {self.strategy!r})")
        if not isinstance(self.strategy_options, dict):
            raise InputError("strategy_options", "must be an object of option names to values")
        if self.granularity is not None and self.granularity not in GRANULARITIES:
            raise InputError("granularity", f"must be one of {', '.join(GRANULARITIES)} (got {self.granularity!r})")
        if self.dca not in DCA_MODES:
            raise InputError("dca", f"must be one of {', '.join(DCA_MODES)} (got {self.dca!r})")
        if self.layer is not None and not isinstance(self.layer, str) and (not _is_int(self.layer) or self.layer < 1):
            raise InputError("layer", f"must be a positive integer or a profile's layer name (got {self.layer!r})")
        if self.id is not None and not isinstance(self.id, (str, int)):
            raise InputError("id", "must be a string or an integer")
        if not isinstance(self.explain, bool):
            raise InputError("explain", f"must be true or false (got {self.explain!r})")
        if self.explain and self.multi:
            raise InputError("explain", "explains one query: send the queries one by one")
        if self.document_ids is not None and (self.queries is not None or self.queries_ids is not None):
            raise InputError("queries", "document_ids take one question (query or query_ids)")

    def _check_context(self) -> None:
        if self.document_ids is not None or self.budgets is not None:
            self._check_documents()
            return
        if self.document_id is None:
            _check_text_or_ids("context", self.context, self.context_ids)
            return
        if self.context is not None or self.context_ids is not None:
            raise InputError("document_id", "give either a context or a document_id, not both")
        if not isinstance(self.document_id, str) or not is_document_id(self.document_id):
            raise InputError("document_id", f"must be the {DOCUMENT_ID_CHARS} hex digits a result's document_id "
                             f"carries, or their first {HASH_CHARS} (got {self.document_id!r})")

    def _check_documents(self) -> None:
        ids, budgets = self.document_ids, self.budgets
        if ids is None:
            raise InputError("budgets", "goes with document_ids: one budget per document")
        given = [name for name in ("context", "context_ids", "document_id", "budget") if getattr(self, name) is not None]
        if given:
            raise InputError(given[0], "give document_ids alone (a budget per document in budgets)")
        if not isinstance(ids, list) or not ids:
            raise InputError("document_ids", "must be a non-empty list of document ids")
        if len(ids) > MAX_DOCUMENTS:
            raise InputError("document_ids", f"{len(ids)} documents exceed the limit of {MAX_DOCUMENTS} per request")
        first: dict[str, int] = {}
        for i, doc in enumerate(ids):
            if not isinstance(doc, str) or not is_document_id(doc):
                raise InputError(f"document_ids[{i}]", f"must be the {DOCUMENT_ID_CHARS} hex digits a result's "
                                 f"document_id carries, or their first {HASH_CHARS} (got {doc!r})")
            seen = first.setdefault(doc[:HASH_CHARS].lower(), i)
            if seen != i:
                raise InputError(f"document_ids[{i}]", f"names the document of document_ids[{seen}] again: each "
                                 "document once per request")
        if budgets is None:
            return
        if self.ratio is not None:
            raise InputError("budgets", "give either budgets or ratio, not both")
        if not isinstance(budgets, list) or len(budgets) != len(ids):
            raise InputError("budgets", f"must be a list of {len(ids)} budgets, one per document_ids entry")
        for i, budget in enumerate(budgets):
            if not _is_int(budget) or budget <= 0:
                raise InputError(f"budgets[{i}]", f"must be a positive integer (got {budget!r})")

    def _check_queries(self) -> None:
        if self.queries is None and self.queries_ids is None:
            if self.query is None and self.query_ids is None:
                return  # whether the strategy needs one is its own to say (require_query; e.g. lagkv needs none)
            _check_text_or_ids("query", self.query, self.query_ids)
            return
        given = [name for name in ("query", "query_ids", "queries", "queries_ids") if getattr(self, name) is not None]
        if len(given) > 1:
            raise InputError(given[1], f"give one of query, query_ids, queries, queries_ids (got {', '.join(given)})")
        name, values = ("queries", self.queries) if self.queries is not None else ("queries_ids", self.queries_ids)
        if not isinstance(values, list) or not values:
            raise InputError(name, "must be a non-empty list")
        if len(values) > MAX_QUERIES:
            raise InputError(name, f"{len(values)} queries exceed the limit of {MAX_QUERIES} per request")
        for i, value in enumerate(values):
            if name == "queries" and (not isinstance(value, str) or not value):
                raise InputError(f"queries[{i}]", "must be a non-empty string")
            if name == "queries_ids" and (not isinstance(value, list) or not value or not all(_is_int(x) for x in value)):
                raise InputError(f"queries_ids[{i}]", "must be a non-empty list of integer token ids")

    @property
    def multi(self) -> bool:
        """True when the request carries a list of queries or of documents (and gets a list of results)."""
        return self.queries is not None or self.queries_ids is not None or self.document_ids is not None

    def query_inputs(self) -> list[tuple[str | None, list[int] | None]]:
        """(text, ids) of every query, in order; exactly one of the two is set, except for a request
        without a query (query-agnostic strategies), which has one query with neither."""
        if self.queries is not None:
            return [(text, None) for text in self.queries]
        if self.queries_ids is not None:
            return [(None, ids) for ids in self.queries_ids]
        return [(self.query, self.query_ids)]

    def budget_for(self, length: int, default: int) -> int:
        """Context tokens to keep of a `length`-token context: the request's budget, its ratio of the
        length (rounded up, at least 1), or `default` (the engine's configured budget). The one rule the
        engine, the worker and the sidecar apply."""
        return budget_for(self.budget, self.ratio, length, default)

    def require_query(self) -> None:
        """InputError naming `query` when the request carries none (a strategy that scores by the query needs one;
        the strategy's owner asks, compressor/strategies.requested_strategy)."""
        if self.queries is None and self.queries_ids is None:
            _check_text_or_ids("query", self.query, self.query_ids)

    @classmethod
    def from_json(cls, data: Any, defaults: dict[str, Any] | None = None) -> "CompressRequest":
        """Build from a decoded JSON object; `defaults` fill fields the object leaves out."""
        if not isinstance(data, dict):
            raise InputError("request", "must be a JSON object")
        return cls(**cls.merged_fields(data, defaults))

    @classmethod
    def merged_fields(cls, data: dict[str, Any], defaults: dict[str, Any] | None = None) -> dict[str, Any]:
        """`data`'s fields with `defaults` filling those it leaves out (its own budget or ratio replaces both
        defaults); InputError naming an unknown field."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(unknown[0], f"unknown field (known: {', '.join(sorted(known))})")
        merged = {k: v for k, v in (defaults or {}).items() if v is not None}
        if "budget" in data or "ratio" in data or "budgets" in data:  # a line's own budget/ratio replaces the default
            merged.pop("budget", None)
            merged.pop("ratio", None)
        merged.update({k: v for k, v in data.items() if v is not None})
        return merged


@dataclass(frozen=True)
class ScopedRequest:
    """A request with its caller's document scope (engine/document_names.py; "" without API keys): what a
    queue hands the engine, the scope travelling with the request it belongs to."""

    request: CompressRequest
    scope: str = ""


@dataclass
class CompressResult:
    """The contract's output fields (README, "Compressing": the CLI's --json line, the HTTP answer,
    gRPC's reply); counts are context tokens."""

    id: str | int | None
    token_ids: list[int]
    kept_indices: list[int]
    compressed_context: str
    query: str
    original_tokens: int
    compressed_tokens: int
    ratio: float
    model: str
    layer: int
    strategy: str
    dca: bool
    passthrough: bool
    timings_ms: dict[str, float]
    document_id: str | None = None  # send it instead of the context to ask the same document again
    budget: int | None = None  # the context-token budget applied: the request's, or what an automatic one chose
    explanation: str | None = None  # the HTML page, when the request asked to explain
    granularity: str = "token"  # what was kept whole: single tokens, or units (sentences, lines, records)
    kept_spans: list[list[int]] | None = None  # with units: [start, end) characters of each kept unit in the context
    fell_back: bool = False  # the whole context was read to l_R for this query (the cascade's fallback, or one deep pass for many questions)
    resumed_tokens: int = 0  # context tokens whose prefill was taken on from the caller's cached encoding of them (a grown context)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for optional in ("explanation", "kept_spans"):
            if data[optional] is None:
                del data[optional]
        return data


@dataclass
class CompressResults:
    """What a request gets back, inside the service: one CompressResult per query, in order, all from one
    prefill of the document `document_id`. `single`: the request sent one query (not `queries`), so its
    wire shape is that one CompressResult (`wire()`, `to_dict()`); only the edges (the library's
    `Engine.compress`, HTTP, gRPC, the CLI, the thin client) tell the two shapes apart."""

    id: str | int | None
    document_id: str | None
    results: list[CompressResult]
    single: bool = False

    def wire(self) -> "CompressResult | CompressResults":
        """The answer as the contract gives it: the one result of a one-query request, else these results."""
        return self.results[0] if self.single else self

    def to_dict(self) -> dict[str, Any]:
        """The contract's JSON: the one result's fields, or {id, document_id, results: [...]}."""
        if self.single:
            return self.results[0].to_dict()
        return {"id": self.id, "document_id": self.document_id, "results": [r.to_dict() for r in self.results]}

    @classmethod
    def of_one(cls, result: CompressResult) -> "CompressResults":
        """The answer to a one-query request whose one result is `result`."""
        return cls(result.id, result.document_id, [result], single=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CompressResults":
        """The inverse of `to_dict`, for either shape."""
        if "results" not in data:
            return cls.of_one(CompressResult(**data))
        return cls(data.get("id"), data["document_id"], [CompressResult(**r) for r in data["results"]])


def budget_for(budget: int | None, ratio: float | None, length: int, default: int) -> int:
    """Tokens to keep of `length`: `budget`, else `ratio` of the length (rounded up, at least 1), else `default`."""
    if budget is not None:
        return budget
    if ratio is not None:
        return max(1, math.ceil(ratio * length))
    return default


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_text_or_ids(name: str, text: Any, ids: Any) -> None:
    if text is not None and ids is not None:
        raise InputError(name, f"give either {name} or {name}_ids, not both")
    if text is None and ids is None:
        raise InputError(name, "is required")
    if text is not None:
        if not isinstance(text, str):
            raise InputError(name, "must be a string")
        if not text:
            raise InputError(name, "must not be empty")
    else:
        if not isinstance(ids, list) or not {int}.issuperset(map(type, ids)):  # ints, not bools: at C speed
            raise InputError(f"{name}_ids", "must be a list of integer token ids")
        if not ids:
            raise InputError(f"{name}_ids", "must not be empty")
