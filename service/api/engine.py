"""The engine: a loaded model + tokenizer that turns CompressRequests into CompressResults.

Built once per process (CLI run, later each worker); `compress` is safe to call repeatedly and
holds no per-request state between calls.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ...compressor.pipeline import Selection, SelectionJob, select_context, select_contexts
from ...compressor.prefill import PrefillConfig
from ...models.device import resolve_placement
from ...models.llama import TruncatedLM
from ...models.loader import load_spec, load_tokenizer, load_truncated, resolve_checkpoint
from ...models.profiles import load_profile
from .messages import CompressRequest, CompressResult, InputError

log = logging.getLogger(__name__)

DEFAULT_BUDGET = 1024
AUTO_BATCH_TOKENS = 16384  # batched prefill on accelerators: 32 requests of ~500 tokens


@dataclass(frozen=True)
class EngineConfig:
    """model: reference (folder, .gguf, hub id; None = embedded default); layer: l_R override
    (None = the model's profile); device/dtype: see models/device.py ("auto" = the fastest that
    keeps the selections); prefill: S/W/chunk; limits on what one request may carry; batch_tokens:
    how many padded context tokens short requests may share one batched prefill with (None =
    16384 on GPUs and NPUs, 0 = off on CPUs, where `make bench` measured no gain: the 2 cores are
    as busy with one 300-token request as with 32 of them, and a batch only delays its first ones)."""

    model: str | None = None
    layer: int | None = None
    device: str = "auto"
    dtype: str = "auto"
    prefill: PrefillConfig = field(default_factory=PrefillConfig)
    max_context_tokens: int = 1 << 20
    max_query_tokens: int = 4096
    default_budget: int = DEFAULT_BUDGET
    batch_tokens: int | None = None  # padded context tokens per batched prefill; 0 = off, None = auto


class Engine:
    """Loads the checkpoint truncated at l_R and serves compressions."""

    def __init__(self, config: EngineConfig | None = None):
        self.config = config = config or EngineConfig()
        self.placement = resolve_placement(config.device, config.dtype)
        checkpoint = resolve_checkpoint(config.model)
        self.checkpoint = checkpoint
        self.spec = load_spec(checkpoint.path)
        self.profile = load_profile(checkpoint.name, self.spec.num_layers)
        if not self.profile.calibrated and config.layer is None:
            log.warning("no calibrated profile for %s: using layer %d (run `ilre calibrate`)",
                        checkpoint.name, self.profile.retrieval_layer)
        self.layer = config.layer or self.profile.retrieval_layer
        self._check_layer(self.layer, "layer")
        self.tokenizer = load_tokenizer(checkpoint.path)
        self._models: dict[int, TruncatedLM] = {}
        self.model_at(self.layer)

    @property
    def model_name(self) -> str:
        return self.checkpoint.name

    def model_at(self, layer: int) -> TruncatedLM:
        """The model truncated at `layer` (loaded on first use; loads are fast, reads are partial)."""
        if layer not in self._models:
            self._models[layer] = load_truncated(self.checkpoint.path, layer, self.placement.dtype, self.placement.device)
        return self._models[layer]

    def _check_layer(self, layer: int, name: str) -> None:
        if not 1 <= layer <= self.spec.num_layers:
            raise InputError(name, f"must be in 1..{self.spec.num_layers} (got {layer})")

    def _ids(self, name: str, text: str | None, ids: list[int] | None, limit: int, limit_name: str) -> torch.Tensor:
        """(T,) int64 token ids of a text or checked ids; InputError when empty, too long, off-vocabulary."""
        if ids is None:
            ids = self.tokenizer(text, add_special_tokens=False).input_ids
        if not ids:
            raise InputError(name, "has no tokens")
        if len(ids) > limit:
            raise InputError(name, f"{len(ids)} tokens exceed the limit of {limit} ({limit_name})")
        try:
            tensor = torch.tensor(ids, dtype=torch.int64)
        except (OverflowError, RuntimeError, ValueError):  # beyond int64: the error path may loop
            bad = next(i for i in ids if not -(1 << 63) <= i < (1 << 63))
            raise InputError(f"{name}_ids", f"token id {bad} outside the vocabulary 0..{self.spec.vocab_size - 1}") from None
        outside = (tensor < 0) | (tensor >= self.spec.vocab_size)
        if bool(outside.any()):
            bad = int(tensor[outside][0])
            raise InputError(f"{name}_ids", f"token id {bad} outside the vocabulary 0..{self.spec.vocab_size - 1}")
        return tensor

    def budget_for(self, request: CompressRequest, length: int) -> int:
        """Context tokens to keep: the request's budget, its ratio of `length`, or the default."""
        if request.budget is not None:
            return request.budget
        if request.ratio is not None:
            return max(1, math.ceil(request.ratio * length))
        return self.config.default_budget

    def compress(self, request: CompressRequest) -> CompressResult:
        """Tokenize, select context tokens, detokenize; raises InputError for bad input."""
        job = self._prepare(request)
        selection = select_context(job.model, job.selection.context_ids, job.selection.query_ids,
                                   job.selection.budget, job.selection.strategy, job.prefill)
        return self._finish(job, selection)

    @property
    def batch_tokens(self) -> int:
        """Padded context tokens per batched prefill (0 = short requests run one by one)."""
        if self.config.batch_tokens is not None:
            return self.config.batch_tokens
        return 0 if self.placement.device.type == "cpu" else AUTO_BATCH_TOKENS

    def compress_many(self, requests: list[CompressRequest],
                      on_result: Callable[[int, CompressResult | InputError], None] | None = None,
                      ) -> list[CompressResult | InputError]:
        """Compress a batch: each request's result, or the InputError that rejected it (in order).
        Short requests on the same layer and DCA setting share one batched prefill when
        `batch_tokens` allows; the results equal those of `compress` one by one.
        `on_result(i, outcome)` is called as soon as request i is done."""
        outcomes: list[CompressResult | InputError | None] = [None] * len(requests)

        def deliver(i: int, outcome: CompressResult | InputError) -> None:
            outcomes[i] = outcome
            if on_result is not None:
                on_result(i, outcome)

        groups: dict[tuple, list[tuple[int, _Job]]] = {}
        for i, request in enumerate(requests):
            try:
                job = self._prepare(request)
            except InputError as exc:
                deliver(i, exc)
                continue
            groups.setdefault((job.layer, job.prefill), []).append((i, job))
        for (layer, prefill), members in groups.items():
            def selected(k: int, selection: Selection, members: list[tuple[int, _Job]] = members) -> None:
                index, job = members[k]
                deliver(index, self._finish(job, selection))

            select_contexts(self.model_at(layer), [job.selection for _, job in members], prefill, self.batch_tokens,
                            done=selected)
        return outcomes  # type: ignore[return-value]

    def _prepare(self, request: CompressRequest) -> "_Job":
        """Check and tokenize a request; InputError naming the field when it cannot run."""
        start = time.perf_counter()
        strategy = request.build_strategy()
        layer = request.layer or self.layer
        self._check_layer(layer, "layer")
        context_ids = self._ids("context", request.context, request.context_ids,
                                self.config.max_context_tokens, "max_context_tokens")
        query_ids = self._ids("query", request.query, request.query_ids,
                              self.config.max_query_tokens, "max_query_tokens")
        budget = self.budget_for(request, len(context_ids))
        total = len(context_ids) + len(query_ids)
        dca = request.dca == "on" or (request.dca == "auto" and total > self.spec.native_context)
        prefill = PrefillConfig(self.config.prefill.sink, self.config.prefill.window, self.config.prefill.chunk, dca)
        model = self.model_at(layer) if strategy.needs_attention else None
        return _Job(request, SelectionJob(context_ids, query_ids, budget, strategy), layer, prefill, model, dca,
                    start, _ms(start, time.perf_counter()))

    def _finish(self, job: "_Job", selection: Selection) -> CompressResult:
        """Kept indices -> token ids, detokenized text and timings."""
        request, context_ids, query_ids = job.request, job.selection.context_ids, job.selection.query_ids
        kept = selection.kept.tolist()
        kept_ids = context_ids[selection.kept].tolist()
        query_list = query_ids.tolist()
        selected = time.perf_counter()
        compressed = self.tokenizer.decode(kept_ids)
        query = request.query if request.query is not None else self.tokenizer.decode(query_list)
        timings = {"tokenize": job.tokenize_ms, **selection.timings_ms, "detokenize": _ms(selected, time.perf_counter())}
        timings["total"] = _ms(job.started, time.perf_counter())
        return CompressResult(
            id=request.id, token_ids=kept_ids + query_list, kept_indices=kept, compressed_context=compressed,
            query=query, original_tokens=len(context_ids), compressed_tokens=len(kept),
            ratio=round(len(kept) / len(context_ids), 6), model=self.model_name, layer=job.layer,
            strategy=job.selection.strategy.name, dca=job.dca, passthrough=selection.passthrough, timings_ms=timings,
        )


@dataclass(frozen=True)
class _Job:
    """A checked, tokenized request on its way through the engine."""

    request: CompressRequest
    selection: SelectionJob
    layer: int
    prefill: PrefillConfig
    model: TruncatedLM | None
    dca: bool
    started: float
    tokenize_ms: float


def _ms(a: float, b: float) -> float:
    return round((b - a) * 1000.0, 3)
