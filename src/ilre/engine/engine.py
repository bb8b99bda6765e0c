"""The engine: a loaded model + tokenizer that turns CompressRequests into CompressResults.

Built once per process (a CLI run, a server, each worker); `compress` is safe to call repeatedly and
holds no per-request state between calls.
"""

from __future__ import annotations

import hashlib
import logging
import time
import weakref
from typing import Callable

import torch

from ..compressor.context_state import ContextState
from ..compressor.pipeline import Selection, SelectionJob, joins_a_batch, select, select_batch
from ..compressor.prefill_config import PrefillConfig
from ..compressor.strategies import STRATEGIES, Strategy, requested_strategy
from ..compressor.units import UNITS_VERSION, Units, document_units
from ..contract.defaults import AUTO_BATCH_TOKENS, DEFAULT_STRATEGY, MAX_EXPLAIN_TOKENS
from ..contract.info import ModelInfo
from ..contract.messages import (CompressRequest, CompressResult, CompressResults, InputError, NotFoundError,
                                 ScopedRequest)
from ..kernels.cache_dir import cache_root
from ..kernels.native_status import kernel_status
from ..models.device import resolve_placement
from ..models.gguf_tensors import linked_gguf
from ..models.int8 import (Calibration, ENCODING_NAME as INT8_ENCODING_NAME, calibration_sequences,
                           quantize as quantize_int8)
from ..models.llama import TruncatedLM
from ..models.loader import load_spec, load_tokenizer, load_truncated, resolve_checkpoint
from ..models.profiles import Profile, load_profile
from ..models.retaining_head import attach_head, head_directories, head_path
from ..models.token_bytes import context_bytes, token_bytes
from .compute_thread import ComputeThread
from .deepening import Deepener
from .document_names import DocumentNames
from .documents import DocumentCache, SharedDocuments
from .encodings import EncodingPolicy
from .engine_config import EngineConfig
from .heap import HeapTrimmer
from .known_texts import KnownTexts
from .prepared import Prepared, checked_ids
from .results import results_of_job
from .shared_questions import run_documents

log = logging.getLogger(__name__)

# The same words for every miss (the id is not echoed: logs never carry an id another key was given)
NOT_FOUND_MESSAGE = ("no such document in the cache (unknown, evicted, or stored with another API key): "
                     "send the context again")


class Engine:
    """Loads the checkpoint truncated at l_R and serves compressions.

    Every context is remembered by its document_id, and its encoded prefill is kept in the
    document cache, so later queries of the same document (by text, IDs or id) skip the prefill.
    Documents belong to a scope (the caller's, engine/document_names.py): a request finds only its
    own scope's. `names` issues the ids under the document secret (a random one for this process until
    the service sets its own).
    One engine runs one request at a time (a query pass uses its cached context as scratch); with
    `deepen`, a background thread uses the idle moments between requests (engine/deepening.py)."""

    def __init__(self, config: EngineConfig | None = None, shared_documents: SharedDocuments | None = None,
                 profile: Profile | None = None):
        """`profile`: a calibration other than the model's stored one (its l_R, named layers and strategy options;
        e.g. one being tried before `ilre calibrate` stores it); None = the stored profile."""
        self.config = config = config or EngineConfig()
        self.placement = resolve_placement(config.device, config.dtype)
        checkpoint = resolve_checkpoint(config.model)
        self.checkpoint = checkpoint
        self.spec = load_spec(checkpoint.path, config.decoder)
        self.profile = profile or load_profile(checkpoint.name, self.spec.num_layers, self.spec.global_layers)
        if not self.profile.calibrated and config.layer is None:
            log.warning("no calibrated profile for %s: using layer %d (run `ilre calibrate`)",
                        checkpoint.name, self.profile.retrieval_layer)
        self.layer = self.profile.retrieval_layer if config.layer is None else self.resolve_layer(config.layer)
        self.tokenizer = load_tokenizer(checkpoint.path)
        self.names = DocumentNames()
        self.texts = KnownTexts()  # contexts sent as text: tokenized once while their IDs are cached
        self.thread = ComputeThread()  # every kernel of this engine runs on it (engine/compute_thread.py)
        weakref.finalize(self, self.thread.close)
        self.deepening = Deepener(config.deepen, self.thread.call)  # also whose turn it is: one request at a time
        self.heap = HeapTrimmer()  # freed memory back to the system after requests
        documents = DocumentCache(config.doc_cache_mb << 20, shared_documents, config.doc_cache_share)
        encoded_as = INT8_ENCODING_NAME if self.placement.int8 else self.placement.dtype_name  # int8: by its rounding too
        self.encodings = EncodingPolicy(documents, self.deepening, encoded_as, config.resume,
                                        hold_streams=config.hold_streams)
        self._models: dict[int, TruncatedLM] = {}
        self.thread.call(self.model_at, self.layer)

    @property
    def documents(self) -> DocumentCache:
        """The document cache (the encoding policy's: engine/encodings.py)."""
        return self.encodings.documents

    @documents.setter
    def documents(self, cache: DocumentCache) -> None:
        self.encodings.documents = cache

    @property
    def model_name(self) -> str:
        return self.checkpoint.name

    def model_at(self, layer: int) -> TruncatedLM:
        """The model truncated at `layer` (loaded on first use; loads are fast, reads are partial)."""
        if layer not in self._models:
            model = load_truncated(self.checkpoint.path, layer, self.placement.dtype, self.placement.device,
                                   self.config.decoder)
            if self.placement.int8 and getattr(model, "fast", True):  # the family path runs float32 there
                model = quantize_int8(model, self._int8_calibration(), self._scored_layers())
            self._models[layer] = attach_head(model, self.checkpoint.name)
            self.heap.after_work(force=True)  # what the load freed (unfused or unpacked weights) back to the system
        return self._models[layer]

    def _int8_calibration(self) -> Calibration:
        """GPTQ's calibration for `--dtype int8` (models/int8.py), its rounding kept under the cache folder."""
        weights = sorted(self.checkpoint.path.glob("*.safetensors")) or [linked_gguf(self.checkpoint.path)]
        stamp = hashlib.sha256(repr([(w.name, w.stat().st_size, w.stat().st_mtime_ns) for w in weights]).encode())
        return Calibration(calibration_sequences(lambda text: self.tokenizer(text).input_ids), cache_root() / "int8",
                           f"{self.checkpoint.name}-{stamp.hexdigest()[:8]}")

    def _scored_layers(self) -> frozenset[int]:
        """The layers whose query attention is scored: the named retrieval layers and the cascade's coarse layer."""
        coarse = self.profile.strategy_options("cascade").get("coarse_layer")
        return frozenset(self.profile.choices.values()) | ({int(coarse)} if coarse else set())

    def info(self) -> ModelInfo:
        """What this engine serves (GetModelInfo, /v1/model): the model, its layers, the limits, the default."""
        cfg, spec = self.config, self.spec
        return ModelInfo(
            model=self.model_name, layer=self.layer, num_layers=spec.num_layers, vocab_size=spec.vocab_size,
            native_context=spec.native_context, calibrated=bool(self.profile.calibrated), strategies=sorted(STRATEGIES),
            default_budget=cfg.default_budget, max_context_tokens=cfg.max_context_tokens,
            max_query_tokens=cfg.max_query_tokens, sink=cfg.prefill.sink, window=cfg.prefill.window or 0,
            chunk=cfg.prefill.chunk, device=str(self.placement.device), dtype=self.placement.dtype_name,
            layer_choices=self.profile.choices, default_strategy=DEFAULT_STRATEGY,
            default_strategy_options=self.profile.strategy_options(DEFAULT_STRATEGY),
            kernels=kernel_status(self.placement.dtype) if self.placement.device.type == "cpu" else {},
        )

    def head_layers(self) -> list[int]:
        """The layers with a stored retaining head (Locret) for this model."""
        return [l for l in range(1, self.spec.num_layers + 1)
                if any(head_path(self.model_name, l, d).is_file() for d in head_directories())]

    def _heads_found(self) -> str:
        return ", ".join(f"layer {l}" for l in self.head_layers()) or "none"

    def strategy_layer(self, strategy: Strategy, layer: int | str | None) -> int:
        """The layer a request runs at: its own, or for a strategy that reads a retaining head and names no
        layer, l_R when a head is stored there, else the stored head's layer nearest to l_R."""
        if layer is not None or "retaining" not in strategy.context_parts:
            return self.resolve_layer(layer)
        heads = self.head_layers()
        return self.layer if self.layer in heads or not heads else min(heads, key=lambda l: (abs(l - self.layer), l))

    def with_profile(self, strategy: Strategy) -> Strategy:
        """The strategy with the options it leaves unset taken from the model's profile (the cascade's
        calibrated coarse layer and candidates). Where the document cache holds no streams (`--deepen off`), a
        first question runs its candidates from layer 1 unless the request says otherwise, so that a context taken
        on from a cached prefix (whose stream is not kept) selects what it selects alone."""
        defaults = self.profile.strategy_options(strategy.name)
        if not self.encodings.holds_streams:
            defaults = {"first_from_stream": False, **defaults}
        return strategy.with_defaults(defaults)

    def fitting(self, requested: Strategy, layer: int) -> Strategy:
        """`requested` with the profile's options where its reading plan can read them at `layer`, else as requested
        (a profile's coarse layer at or above a requested l_R); InputError naming the option when neither fits."""
        for strategy in (self.with_profile(requested), requested):
            try:
                strategy.reading().encoded_layers(layer)
                return strategy
            except ValueError as exc:
                refused = exc
        raise InputError.from_option_error(refused) from None

    def resolve_layer(self, layer: int | str | None, name: str = "layer") -> int:
        """A request's layer: None = the engine's l_R, a number (checked), or a name of the profile's choices."""
        if layer is None:
            return self.layer
        if isinstance(layer, str):
            choices = self.profile.choices
            if layer not in choices:
                offered = ", ".join(f"{k} ({v})" for k, v in sorted(choices.items()))
                raise InputError(name, f"{layer!r} is not a layer the profile of {self.model_name} names (it offers "
                                 f"{offered}; `ilre calibrate` measures fast and robust)")
            return choices[layer]
        self._check_layer(layer, name)
        return layer

    def _check_layer(self, layer: int, name: str) -> None:
        if not 1 <= layer <= self.spec.num_layers:
            raise InputError(name, f"must be in 1..{self.spec.num_layers} (got {layer})")

    def units(self, slot: str, context_ids: torch.Tensor, owner: str = "") -> Units:
        """The context's Units (compressor/units.py), computed once per document and kept
        with it in the document cache (under its `slot`, in `owner`'s share)."""
        return self.documents.units(slot, UNITS_VERSION,
                                    lambda: document_units(context_bytes(token_bytes(self.tokenizer), context_ids)),
                                    owner)

    def _known_text(self, key: bytes, names: DocumentNames, scope: str) -> torch.Tensor | None:
        """The token IDs of a text `scope` sent before (its KnownTexts `key`) while this process's document cache
        holds them, else None (tokenize it)."""
        doc = self.texts.get(key)
        return None if doc is None else self.documents.held_ids(names.slot(scope, doc))

    def _ids(self, name: str, text: str | None, ids: list[int] | None, limit: int, limit_name: str,
             ids_field: str | None = None) -> torch.Tensor:
        return checked_ids(self.tokenizer, self.spec.vocab_size, name, text, ids, limit, limit_name, ids_field)

    def query_ids(self, text: str | None, ids: list[int] | None) -> list[int]:
        """A query's checked token ids (InputError naming `query` or `query_ids` and the limit)."""
        return self._ids("query", text, ids, self.config.max_query_tokens, "max_query_tokens").tolist()

    def compress(self, request: CompressRequest, scope: str = "") -> CompressResult | CompressResults:
        """The library's call: `run`'s answer in the contract's shape (a CompressResult, or CompressResults
        for a request with `queries`)."""
        return self.run(request, scope).wire()

    def run(self, request: CompressRequest, scope: str = "") -> CompressResults:
        """Tokenize, select context tokens, detokenize: one result per query (one prefill for all). Raises
        InputError for bad input and NotFoundError for a document_id that `scope` (the caller's, "" without
        API keys) does not hold. Runs on the engine's thread, whichever thread calls."""
        return self.thread.call(self._run, request, scope)

    def _run(self, request: CompressRequest, scope: str) -> CompressResults:
        try:
            with self.deepening.turn():
                if request.document_ids is not None:
                    return run_documents(self, request, scope)
                job = self.prepare(request, scope)
                return self.finish(job, self.answer(job))
        finally:
            self.heap.after_work()

    @property
    def batch_tokens(self) -> int:
        """Padded context tokens per batched prefill (0 = short requests run one by one)."""
        if self.config.batch_tokens is not None:
            return self.config.batch_tokens
        return 0 if self.placement.device.type == "cpu" else AUTO_BATCH_TOKENS

    def adopt_secret(self, secret: bytes) -> bool:
        """Issue document ids under `secret` (the service's, at least MIN_SECRET_CHARS long) from now on; False
        when it is the one in use already. Ids issued under another secret are then unknown."""
        if secret == self.names.secret:
            return False
        self.names = DocumentNames(secret)
        return True

    def compress_many(self, requests: list[CompressRequest | ScopedRequest],
                      on_result: Callable[[int, CompressResults | InputError], None] | None = None,
                      ) -> list[CompressResults | InputError]:
        """Compress a batch: each request's outcome, or the InputError that rejected it (in order); a
        ScopedRequest carries its caller's document scope (a bare request: "").
        Short one-query requests on the same layer and DCA setting share one batched prefill when
        `batch_tokens` allows; the others go through the document cache. The results equal those
        of `run` one by one. `on_result(i, outcome)` is called as soon as request i is done (on the engine's
        thread, where the batch runs whichever thread calls)."""
        return self.thread.call(self._compress_many, requests, on_result)

    def _compress_many(self, requests: list[CompressRequest | ScopedRequest],
                       on_result: Callable[[int, CompressResults | InputError], None] | None,
                       ) -> list[CompressResults | InputError]:
        outcomes: list[CompressResults | InputError | None] = [None] * len(requests)

        def deliver(i: int, outcome: CompressResults | InputError) -> None:
            outcomes[i] = outcome
            if on_result is not None:
                on_result(i, outcome)

        with self.deepening.turn():
            self._run_many([r if isinstance(r, ScopedRequest) else ScopedRequest(r) for r in requests], deliver)
        self.heap.after_work()
        return outcomes  # type: ignore[return-value]

    def _run_many(self, requests: list[ScopedRequest], deliver: Callable[[int, CompressResults | InputError], None]
                  ) -> None:
        groups: dict[tuple, list[tuple[int, Prepared]]] = {}
        alone: list[tuple[int, Prepared]] = []
        for i, asked in enumerate(requests):
            try:
                if asked.request.document_ids is not None:
                    deliver(i, run_documents(self, asked.request, asked.scope))
                    continue
                job = self.prepare(asked.request, asked.scope)
            except InputError as exc:
                deliver(i, exc)
                continue
            if self._batchable(job):
                groups.setdefault((job.layer, job.prefill), []).append((i, job))
            else:
                alone.append((i, job))
        for (layer, prefill), members in groups.items():
            def selected(k: int, selection: Selection, members: list[tuple[int, Prepared]] = members) -> None:
                index, job = members[k]
                deliver(index, self.finish(job, [selection]))

            select_batch(self.model_at(layer), [job.selection() for _, job in members], prefill, self.batch_tokens,
                         done=selected)
        for i, job in alone:
            deliver(i, self.finish(job, self.answer(job)))

    def _batchable(self, job: Prepared) -> bool:
        """A one-query request whose context is a single prefill chunk, when batching is on."""
        return (self.batch_tokens > 0 and len(job.queries) == 1 and job.model is not None
                and joins_a_batch(job.context_ids.numel(), job.budget, job.strategy.reading(), job.prefill)
                and getattr(job.model, "plain", True))  # a family with other layer kinds runs alone

    def close(self) -> None:
        """Stop the background deepening (after its step in progress); the engine still answers (its thread
        ends with the engine)."""
        self.deepening.close()

    def answer(self, job: Prepared) -> list[Selection]:
        """The Selection stage: one selection per query, all against one encoded context, as the encoding policy
        plans it (engine/encodings.py: the document cache's, deepened documents, the fallback's deep read)."""
        plan = self.encodings.plan(job)
        selections = select(job.model, SelectionJob(job.context_ids, job.queries, job.budget, plan.strategy, job.units,
                                                    plan.encodings), job.prefill)
        self.encodings.settle(job, plan, selections)
        return selections

    def encode(self, job: Prepared) -> ContextState:
        """The job's encoded context as its strategy reads it: the document cache's, or encoded now and kept
        there (what `answer` then reads; the evaluation times the two apart)."""
        return self.encodings.encode(job)

    def encoding_key(self, job: Prepared) -> str:
        """The document cache's key of the encoding `encode(job)` returns (equal keys: the same encoding)."""
        return self.encodings.key(job, job.strategy)

    def prepare(self, request: CompressRequest, scope: str = "") -> Prepared:
        """The Prepared stage: check and tokenize a request of a caller in `scope`; InputError naming the field when it
        cannot run, NotFoundError for a document_id the scope does not hold (another scope's id takes
        the same path as one never issued: its slot is simply not there)."""
        start = time.perf_counter()
        requested = requested_strategy(request)
        layer = self.strategy_layer(requested, request.layer)
        strategy = self.fitting(requested, layer)
        names = self.names  # one secret for the whole request, even while it is being replaced
        if request.document_id is not None:
            doc = request.document_id
            slot = names.slot(scope, doc)
            context_ids = self.documents.ids(slot, names.owner(scope))
            if context_ids is None:
                raise NotFoundError("document_id", NOT_FOUND_MESSAGE)
        else:
            sent_text = request.context is not None and request.context_ids is None
            known = KnownTexts.key(scope, request.context) if sent_text else None
            context_ids = self._known_text(known, names, scope) if known is not None else None
            if context_ids is None:
                context_ids = self._ids("context", request.context, request.context_ids,
                                        self.config.max_context_tokens, "max_context_tokens")
            doc = names.document_id(scope, self.model_name, context_ids)
            slot = names.slot(scope, doc)
            self.documents.remember(slot, context_ids, names.owner(scope))
            if known is not None:
                self.texts.put(known, doc)
        queries = [torch.empty(0, dtype=torch.int64) if text is None and ids is None  # no query (lagkv)
                   else self._ids("query", text, ids, self.config.max_query_tokens, "max_query_tokens") if not request.multi
                   else self._ids(f"queries[{i}]" if text is not None else f"queries_ids[{i}]", text, ids,
                                  self.config.max_query_tokens, "max_query_tokens", f"queries_ids[{i}]")
                   for i, (text, ids) in enumerate(request.query_inputs())]
        if request.explain and len(context_ids) > MAX_EXPLAIN_TOKENS:
            raise InputError("explain", f"{len(context_ids)} context tokens exceed the limit of {MAX_EXPLAIN_TOKENS} "
                             "for an explanation page")
        budget = request.budget_for(len(context_ids), self.config.default_budget)
        strategy = strategy.reading().for_context(len(context_ids), budget).scorer
        total = len(context_ids) + max(len(q) for q in queries)
        dca = request.dca == "on" or (request.dca == "auto" and total > self.spec.native_context)
        if dca and self.model_at(layer).inv_freq is None:  # no RoPE shared by its global layers to move keys by
            if request.dca == "on":
                raise InputError("dca", f"not available for {self.spec.model_type}: its global layers' position "
                                 "encoding is not one rotate-half RoPE (see README, Models)")
            dca = False
        prefill = PrefillConfig(self.config.prefill.sink, self.config.prefill.window, self.config.prefill.chunk, dca)
        granularity = request.granularity or self.profile.granularity
        owner = names.owner(scope)
        units = self.units(slot, context_ids, owner) if granularity == "unit" and budget < len(context_ids) else None
        model = self.model_at(layer) if strategy.needs_attention else None
        if "retaining" in strategy.context_parts and model.retaining_head is None:
            raise InputError("strategy", f"{strategy.name} needs a retaining head for {self.model_name} at layer {layer}: "
                             f"train one with `ilre train-locret --layer {layer}` (heads found: {self._heads_found()})")
        if model is not None and not getattr(model, "plain", True) and getattr(strategy, "cascade_layer", None):
            raise InputError("strategy_options", f"coarse_layer: the cascade's candidate pass needs every layer below "
                             f"l_R to be full attention without sinks; {self.spec.model_type} has other kinds there "
                             "(see README, Models): leave coarse_layer unset")
        return Prepared(request, doc, slot, context_ids, queries, budget, strategy, layer, prefill, model, dca,
                        start, round((time.perf_counter() - start) * 1000.0, 3), granularity, units,
                        lambda ends: names.prefix_slots(scope, self.model_name, context_ids, ends), owner)

    def finish(self, job: Prepared, selections: list[Selection]) -> CompressResults:
        """The last stage: kept indices -> token ids, detokenized text and timings, one result per query."""
        return results_of_job(self.tokenizer, self.model_name, self.config.prefill.sink, job, selections)
