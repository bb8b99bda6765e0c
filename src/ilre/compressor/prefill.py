"""Streaming chunked prefill (ILRe section 3.3) with optional DCA (eqs. 6-7).

Data flow for one request, all on one device:
  context ids (L,) -> chunks [0, chunk+S), [chunk+S, 2*chunk+S), ...
  layers 1..l_R-1: each chunk attends to [S sink | last W tokens before it | itself, causally];
                   only the sink and window K/V of each layer are kept (O((S+W) l_R) memory)
  layer l_R:       only K is computed for context chunks, written into a preallocated
                   (kv_heads, L, d) cache per score layer
  query ids (Lq,) -> one more chunk through the same layers; its Q is taken at each score layer
`encode_context` runs the context chunks into a ContextState (query-independent: the keys and the
window caches at the end of the context); `prefill_query` runs a query against it, as often as
wanted. `resume_context` takes an encoding kept with its resume point (the residual stream entering its
top layer, `keep_hidden`) deeper, running only the layers below l_R that it lacks: a shallow encoding and
its resumption cost one deep encoding plus the shallow top layer's projections again. The prefill knows
nothing about strategies: it returns keys and queries, a strategy scores them. The window caches live in
window_cache.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Generator

import torch

from ..kernels.rope import rerotate
from ..models.llama import RETRIEVAL_PARTS, TruncatedLM
from .prefill_config import PrefillConfig
from .window_cache import WindowCache


# per-token extras of the context a strategy may ask for at l_R: values and raw_keys (kv_heads, L, d) and
# raw_queries (heads, L, d) in the model's dtype; retaining (kv_heads, L, 1) float32, the predictions of
# the model's Locret retaining head (the others are what that head reads, and trains on)
CONTEXT_PARTS = ("values", "raw_keys", "raw_queries", "retaining")
QUERY_PARTS = ("raw_queries",)  # and of the query
HEAD_INPUTS = ("raw_queries", "raw_keys", "values")  # what the retaining head reads


def part_shape(name: str, model: TruncatedLM, length: int) -> tuple[tuple[int, int, int], torch.dtype]:
    """(shape, dtype) of a context part's cache for a context of `length` tokens."""
    spec = model.spec
    if name == "retaining":
        return (spec.num_kv_heads, length, 1), torch.float32
    heads = spec.num_heads if name == "raw_queries" else spec.num_kv_heads
    return (heads, length, spec.head_dim), model.dtype


def empty_part(name: str, model: TruncatedLM, length: int) -> torch.Tensor:
    """An uninitialised cache for a context part ("keys" or one of CONTEXT_PARTS) of `length` tokens."""
    shape, dtype = part_shape(name, model, length)
    return torch.empty(shape, dtype=dtype, device=model.device)


@dataclass
class RetrievalState:
    """keys[l]: (kv_heads, L, d) context keys at score layer l (re-rotated if DCA);
    queries[l]: (heads, Lq, d) query states at score layer l; parts: the extras asked for at l_R:
    values, raw_keys (kv_heads, L, d: before RoPE, so never moved by DCA), raw_queries (heads, Lq, d)."""

    keys: dict[int, torch.Tensor]
    queries: dict[int, torch.Tensor]
    parts: dict[str, torch.Tensor] = field(default_factory=dict)


def chunk_bounds(length: int, config: PrefillConfig) -> list[tuple[int, int]]:
    """[start, end) of each context chunk: the first holds chunk + sink tokens, the rest chunk."""
    bounds, start = [], 0
    end = min(length, config.chunk + config.sink)
    while start < length:
        bounds.append((start, end))
        start, end = end, min(length, end + config.chunk)
    return bounds


@dataclass
class ContextState:
    """The query-independent part of the prefill, as it stands at the end of the context.

    keys[l]: (kv_heads, L, d) context keys at each score layer l (re-rotated if DCA); caches[l-1]:
    the sink and window K/V of layer l < top, frozen once the context is encoded (`WindowCache.freeze`:
    the live entries only; a query attends through a copy of them plus its own K/V); length: L;
    n_chunks: N_C. Any number of queries can be run against it one after another (`prefill_query`);
    a query pass may re-rotate the sink keys in place (DCA), so passes run one at a time.
    parts: the CONTEXT_PARTS encoded at l_R (shapes: `part_shape`); scores: (L,) scores of
    query-agnostic strategies, memoised by `Strategy.memo_key`; hidden: (L, D) in the model's dtype, the
    residual stream entering the top layer for every context token, kept only when asked
    (`encode_context(keep_hidden=True)`): from it `resume_context` takes the encoding deeper without
    layers 1..top-1 (never stored: `to_tensors` leaves it out).
    """

    length: int
    n_chunks: int
    config: PrefillConfig
    keys: dict[int, torch.Tensor]
    caches: list[WindowCache]
    parts: dict[str, torch.Tensor] = field(default_factory=dict)
    scores: dict[str, torch.Tensor] = field(default_factory=dict)
    hidden: torch.Tensor | None = None

    @property
    def top(self) -> int:
        """The deepest layer encoded: l_R, or the top of a shallower encoding (a cascade's coarse layer)."""
        return max(self.keys)

    @property
    def nbytes(self) -> int:
        """Memory held: the key caches, the extra parts, the window buffers, the memoised scores and the
        resume point (`hidden`) where kept."""
        tensors = list(self.keys.values()) + list(self.parts.values()) + list(self.scores.values())
        tensors += [self.hidden] if self.hidden is not None else []
        return sum(t.numel() * t.element_size() for t in tensors) + sum(c.nbytes for c in self.caches)

    def take_hidden(self) -> torch.Tensor | None:
        """The resume point, removed from the state (which a document cache may then keep without it)."""
        hidden, self.hidden = self.hidden, None
        return hidden

    def to_tensors(self) -> dict[str, torch.Tensor]:
        """What a later query reads, as named contiguous tensors (a document store saves them):
        "meta" (length, n_chunks); "keys.{l}" (kv_heads, L, d); "part.{name}"; per cache i below l_R
        "cache.{i}.k|v" (kv_heads, n_sink + n_window, d): the live entries, "cache.{i}.sink_raw" and
        "cache.{i}.counters" (n_sink, n_window, ring_at, sink_shift). Memoised scores are left out
        (cheap to redo)."""
        out = {"meta": torch.tensor([self.length, self.n_chunks], dtype=torch.int64)}
        out.update({f"keys.{layer}": k.contiguous() for layer, k in self.keys.items()})
        out.update({f"part.{name}": t.contiguous() for name, t in self.parts.items()})
        for i, cache in enumerate(self.caches):
            cache.freeze()
            out[f"cache.{i}.k"] = cache.k.contiguous()
            out[f"cache.{i}.v"] = cache.v.contiguous()
            out[f"cache.{i}.sink_raw"] = cache.sink_raw.contiguous()
            shift = -1 if cache.sink_shift is None else cache.sink_shift
            out[f"cache.{i}.counters"] = torch.tensor([cache.n_sink, cache.n_window, cache.ring_at, shift])
        return out

    @classmethod
    def from_tensors(cls, model: TruncatedLM, config: PrefillConfig, tensors: dict[str, torch.Tensor]) -> "ContextState":
        """The inverse of `to_tensors`, placed on the model's device and dtype. `config` must be the
        one the state was encoded with (a document store keys states by it)."""
        length, n_chunks = (int(x) for x in tensors["meta"].tolist())
        place = {"device": model.device, "dtype": model.dtype}
        keys = {int(name.split(".")[1]): t.to(**place) for name, t in tensors.items() if name.startswith("keys.")}
        parts = {name: t.to(device=model.device, dtype=part_shape(name, model, length)[1])
                 for name, t in ((n.split(".", 1)[1], t) for n, t in tensors.items() if n.startswith("part."))}
        caches = []
        while f"cache.{len(caches)}.k" in tensors:
            i = len(caches)
            caches.append(WindowCache.restored(config, model, tensors[f"cache.{i}.k"], tensors[f"cache.{i}.v"],
                                               tensors[f"cache.{i}.sink_raw"],
                                               [int(x) for x in tensors[f"cache.{i}.counters"].tolist()]))
        return cls(length, n_chunks, config, keys, caches, parts)


def encode_context(
    model: TruncatedLM, context_ids: torch.Tensor, config: PrefillConfig, score_layers: tuple[int, ...] | None = None,
    parts: tuple[str, ...] = (), keep_hidden: bool = False,
) -> ContextState:
    """The context chunks of the streaming prefill: context_ids (L,) int64 -> ContextState.

    score_layers: 1-based layers whose context keys are kept (default: l_R, the model's last layer);
    parts: CONTEXT_PARTS also kept at l_R (values, raw_keys, raw_queries, retaining), for the strategies
    that read them (and for training Locret's head).
    DCA (eq. 7): at score layers the keys of chunk i < N_C - 1 are moved to chunk N_C - 1's start,
    so every query-key distance stays under two chunk lengths.
    keep_hidden: also keep the residual stream entering the top score layer, (L, D) (`ContextState.hidden`),
    so that `resume_context` can take the encoding deeper from there.
    """
    return run_steps(encode_in_steps(model, context_ids, config, score_layers, parts, keep_hidden))


def encode_in_steps(
    model: TruncatedLM, context_ids: torch.Tensor, config: PrefillConfig, score_layers: tuple[int, ...] | None = None,
    parts: tuple[str, ...] = (), keep_hidden: bool = False,
) -> Generator[None, None, ContextState]:
    """`encode_context` one layer of one chunk at a time: a generator that yields after each step and
    returns the ContextState (`run_steps` runs it out), so a background encoding can give way to
    requests between steps. The arguments are checked here, before the first step."""
    l_r = model.n_layers
    score_layers = tuple(sorted(set(score_layers or (l_r,))))
    if score_layers[-1] > l_r or score_layers[0] < 1:
        raise ValueError(f"layer: score layers must be within 1..{l_r} (got {score_layers})")
    length = context_ids.numel()
    unknown = set(parts) - set(CONTEXT_PARTS)
    if unknown:
        raise ValueError(f"parts: unknown context parts {sorted(unknown)} (known: {', '.join(CONTEXT_PARTS)})")
    if parts and score_layers[-1] != l_r:
        raise ValueError("parts: context parts are kept at l_R only: score layers must end at it")
    if "retaining" in parts and getattr(model, "retaining_head", None) is None:
        raise ValueError(f"strategy: no Locret retaining head for this model at layer {l_r}: "
                         f"train one with `ilre train-locret --layer {l_r}`")

    keys = {l: empty_part("keys", model, length) for l in score_layers}
    bounds = chunk_bounds(length, config)
    caches = [WindowCache(config, length, config.chunk, model) for _ in range(score_layers[-1] - 1)]
    state = ContextState(length, len(bounds), config, keys, caches, {name: empty_part(name, model, length) for name in parts})
    if keep_hidden:
        state.hidden = torch.empty(length, model.spec.hidden_size, dtype=model.dtype, device=model.device)
    return _encode_chunks(model, state, bounds, lambda start, end: context_ids[start:end])


def resume_context(model: TruncatedLM, state: ContextState, score_layers: tuple[int, ...],
                   parts: tuple[str, ...] = ()) -> ContextState:
    """`state` (encoded with keep_hidden) taken deeper: the ContextState that `encode_context(model, ids,
    state.config, score_layers, parts)` returns, computing only layers state.top..max(score_layers) (the
    layers below are the same computation, and their window caches and keys are taken from `state`).
    score_layers must hold every layer `state` keeps keys at and end above it; parts are kept at l_R."""
    return run_steps(resume_in_steps(model, state, score_layers, parts))


def resume_in_steps(model: TruncatedLM, state: ContextState, score_layers: tuple[int, ...],
                    parts: tuple[str, ...] = ()) -> Generator[None, None, ContextState]:
    """`resume_context` one layer of one chunk at a time (as `encode_in_steps`)."""
    if state.hidden is None:
        raise ValueError("state: no resume point (encode with keep_hidden=True)")
    score_layers = tuple(sorted(set(score_layers)))
    if not set(state.keys) <= set(score_layers) or score_layers[-1] <= state.top or score_layers[-1] > model.n_layers:
        raise ValueError(f"layer: a resumed encoding keeps layers {sorted(state.keys)} and goes deeper, "
                         f"to at most {model.n_layers} (got {score_layers})")
    if parts and score_layers[-1] != model.n_layers:
        raise ValueError("parts: context parts are kept at l_R only: score layers must end at it")
    length, hidden = state.length, state.hidden
    keys = {l: state.keys[l] if l in state.keys else empty_part("keys", model, length) for l in score_layers}
    caches = list(state.caches) + [WindowCache(state.config, length, state.config.chunk, model)
                                   for _ in range(state.top, score_layers[-1])]
    deeper = ContextState(length, state.n_chunks, state.config, keys, caches,
                          {name: empty_part(name, model, length) for name in parts})
    return _encode_chunks(model, deeper, chunk_bounds(length, state.config), lambda start, end: hidden[start:end],
                          first=state.top)


def run_steps(steps: Generator[None, None, ContextState]) -> ContextState:
    """Run a stepwise encoding (`encode_in_steps`) to its end: its ContextState."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def _encode_chunks(model: TruncatedLM, state: ContextState, bounds: list[tuple[int, int]],
                   inputs: Callable[[int, int], torch.Tensor], first: int = 1) -> Generator[None, None, ContextState]:
    """The context chunks through layers first..top, a step (one layer of one chunk) per `next`; inputs(start,
    end): the chunk's ids (T,) when first = 1, else its residual stream entering layer `first` (T, D)."""
    config = state.config
    base = bounds[-2][0] if len(bounds) >= 2 else 0  # start of chunk N_C - 1 (eq. 7 anchor)
    for index, (start, end) in enumerate(bounds):
        key_shift = base - start if config.dca and index < len(bounds) - 2 else 0
        yield from _context_chunk(model, state, inputs(start, end), start, index, key_shift, first)
    for window_cache in state.caches:
        window_cache.freeze()  # what a query reads and nothing more: a cached document holds only this
    return state


def prefill_query(model: TruncatedLM, state: ContextState, query_ids: torch.Tensor,
                  parts: tuple[str, ...] = ()) -> RetrievalState:
    """The query as one more chunk after the context: query_ids (Lq,) int64 -> the context keys
    and the query states (heads, Lq, d) at every score layer, plus the context's parts and the
    query's `parts` (QUERY_PARTS, e.g. raw_queries) at l_R. The query keeps its natural positions
    L, L+1, ... right after the context."""
    if set(parts) & set(state.parts):
        raise ValueError(f"parts: {sorted(set(parts) & set(state.parts))} asked of both the context and the query")
    queries, found = _query_chunk(model, state, query_ids, tuple(parts))
    return RetrievalState(keys=state.keys, queries=queries, parts={**state.parts, **found})


def streaming_prefill(
    model: TruncatedLM,
    context_ids: torch.Tensor,
    query_ids: torch.Tensor,
    config: PrefillConfig,
    score_layers: tuple[int, ...] | None = None,
) -> RetrievalState:
    """Run the streaming chunked prefill of ILRe over context then query (encode_context, then
    prefill_query). context_ids: (L,) int64; query_ids: (Lq,) int64; score_layers: 1-based layers
    whose context keys and query states are wanted (default l_R). One pass serves them all, which
    is how calibration scores every layer at once."""
    return prefill_query(model, encode_context(model, context_ids, config, score_layers), query_ids)


def _chunk_inputs(model: TruncatedLM, state: ContextState, ids: torch.Tensor, start: int, index: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The embedded chunk (T, D) (ids (T,) int64, or already a residual stream (T, D)), its rotary cos/sin at
    positions start.., and the DCA sink shift: from the third chunk on (eq. 6), layers < l_R see the sink keys
    moved forward by (i-2) chunks."""
    config = state.config
    cos, sin = model.rope(torch.arange(start, start + ids.shape[0], device=model.device))
    sink_shift = (index - 1) * config.chunk if config.dca and index >= 2 else 0
    h = model.embed(ids.to(model.device)) if ids.dim() == 1 else ids.clone()
    return h, cos, sin, sink_shift


def _context_chunk(model: TruncatedLM, state: ContextState, ids: torch.Tensor, start: int, index: int,
                   key_shift: int, first: int = 1) -> Generator[None, None, None]:
    """Context chunk number `index` (ids (T,) at positions start.., or with first > 1 its residual stream
    entering layer `first`, (T, D)) through layers first..top, yielding after each layer: writes its keys at
    every score layer (moved by `key_shift`, eq. 7) and, at l_R, the parts the state keeps; appends its K/V
    to the window cache of every layer below the top; keeps the stream entering the top in `state.hidden`
    where the state keeps one."""
    l_r, top, end = model.n_layers, max(state.keys), start + ids.shape[0]
    h, cos, sin, sink_shift = _chunk_inputs(model, state, ids, start, index)
    for l in range(first, top + 1):
        layer = model.layer(l)
        if l == top and state.hidden is not None:
            state.hidden[start:end] = h
        if l == l_r:  # retrieval layer: only the keys and the parts asked for
            head = "retaining" in state.parts
            wanted = {"keys", *state.parts, *(HEAD_INPUTS if head else ())} - {"retaining"}
            got = layer.parts(h, cos, sin, tuple(p for p in RETRIEVAL_PARTS if p in wanted))
            state.keys[l][:, start:end] = rerotate(got.pop("keys"), model.inv_freq, key_shift)
            if head:
                got["retaining"] = model.retaining_head.score(*(got[p] for p in HEAD_INPUTS))
            for name in state.parts:
                state.parts[name][:, start:end] = got[name]
            return
        q, k, v = layer.qkv(h, cos, sin)  # (H, T, d), (KV, T, d), (KV, T, d)
        if l in state.keys and not (first > 1 and l == first):  # a resumed pass keeps its first layer's keys
            state.keys[l][:, start:end] = rerotate(k, model.inv_freq, key_shift)
        if l == top:
            return
        cache = state.caches[l - 1]
        out = cache.attend(q, k, v, sink_shift, model.inv_freq)
        cache.append(k, v, first=index == 0)
        h = layer.finish(h, out)
        yield


def _query_chunk(model: TruncatedLM, state: ContextState, ids: torch.Tensor, parts: tuple[str, ...]
                 ) -> tuple[dict[int, torch.Tensor], dict[str, torch.Tensor]]:
    """The query (ids (Lq,)) as chunk N_C after the context, through layers 1..top against the state's
    window caches, which it reads and leaves as they were: its queries (heads, Lq, d) at every score
    layer, and at l_R the query `parts` asked for."""
    l_r, top = model.n_layers, max(state.keys)
    h, cos, sin, sink_shift = _chunk_inputs(model, state, ids, state.length, state.n_chunks)
    queries: dict[int, torch.Tensor] = {}
    for l in range(1, top + 1):
        layer = model.layer(l)
        if l == l_r:
            got = layer.parts(h, cos, sin, ("queries", *parts))
            queries[l] = got.pop("queries")
            return queries, got
        q, k, v = layer.qkv(h, cos, sin)
        if l in state.keys:
            queries[l] = q
        if l == top:
            break
        h = layer.finish(h, state.caches[l - 1].attend(q, k, v, sink_shift, model.inv_freq))
    return queries, {}
