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
its resumption cost one deep encoding plus the shallow top layer's projections again. `extend_context` takes
an encoding on to a longer context sharing its tokens (ContextState.resume), running only the new chunks; for
that, DCA's key moves are made when a query reads the keys (`score_keys`). The prefill knows
nothing about strategies: it returns keys and queries, a strategy scores them. The window caches live in
window_cache.py.
"""

from __future__ import annotations

from typing import Callable, Generator

import torch

from ..models.llama import RETRIEVAL_PARTS, TruncatedLM
from .context_state import (CONTEXT_PARTS, HEAD_INPUTS, QUERY_PARTS, ContextState, ResumePoint, RetrievalState,
                            chunk_bounds, empty_part, part_shape, score_keys)
from .layer_caches import layer_cache
from .prefill_config import PrefillConfig

__all__ = ["encode_context", "encode_in_steps", "extend_context", "extend_in_steps", "prefill_query", "resume_context",
           "resume_in_steps", "run_steps", "streaming_prefill"]


def encode_context(
    model: TruncatedLM, context_ids: torch.Tensor, config: PrefillConfig, score_layers: tuple[int, ...] | None = None,
    parts: tuple[str, ...] = (), keep_hidden: bool = False,
) -> ContextState:
    """The context chunks of the streaming prefill: context_ids (L,) int64 -> ContextState.

    score_layers: 1-based layers whose context keys are kept (default: l_R, the model's last layer);
    parts: CONTEXT_PARTS also kept at l_R (values, raw_keys, raw_queries, retaining), for the strategies
    that read them (and for training Locret's head).
    DCA (eq. 7) moves the keys at score layers when a query reads them (`score_keys`); the state keeps each
    at its own position.
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
    caches = [layer_cache(model, l, config, config.chunk) for l in range(1, score_layers[-1])]
    state = ContextState(length, len(bounds), config, keys, caches, {name: empty_part(name, model, length) for name in parts})
    if keep_hidden:
        state.hidden = torch.empty(length, model.residual_width, dtype=model.dtype, device=model.device)
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
    caches = list(state.caches) + [layer_cache(model, l, state.config, state.config.chunk)
                                   for l in range(state.top, score_layers[-1])]
    deeper = ContextState(length, state.n_chunks, state.config, keys, caches,
                          {name: empty_part(name, model, length) for name in parts})
    return _encode_chunks(model, deeper, chunk_bounds(length, state.config), lambda start, end: hidden[start:end],
                          first=state.top, below=state.resume)


def extend_context(model: TruncatedLM, state: ContextState, context_ids: torch.Tensor,
                   keep_hidden: bool = False) -> ContextState:
    """The encoding of a longer context whose first `state.resume.at` tokens are the ones `state` was encoded
    from: what `encode_context(model, context_ids, state.config, <state's layers>, <state's parts>, keep_hidden)`
    returns, running only the chunks after the resume point. context_ids: (L',) int64, L' > resume.at (the
    caller checks that the tokens agree). keep_hidden needs a state that kept its own (`hidden`)."""
    return run_steps(extend_in_steps(model, state, context_ids, keep_hidden))


def extend_in_steps(model: TruncatedLM, state: ContextState, context_ids: torch.Tensor,
                    keep_hidden: bool = False) -> Generator[None, None, ContextState]:
    """`extend_context` one layer of one chunk at a time (as `encode_in_steps`)."""
    point, length = state.resume, context_ids.numel()
    if point is None or point.at == 0 or length <= point.at:
        raise ValueError(f"context: nothing to extend (resume point {point and point.at}, {length} tokens)")
    if keep_hidden and state.hidden is None:
        raise ValueError("state: no stream at the top to extend (encode with keep_hidden=True)")
    bounds = chunk_bounds(length, state.config)
    if bounds[point.n_chunks - 1][1] != point.at:
        raise ValueError(f"context: the resume point {point.at} is not a chunk boundary of {length} tokens")

    def grown(name: str, held: torch.Tensor) -> torch.Tensor:
        out = empty_part(name, model, length)
        out[:, : point.at] = held[:, : point.at]
        return out

    keys = {layer: grown("keys", k) for layer, k in state.keys.items()}
    caches = [cache.thawed(state.config, model) for cache in (point.caches or state.caches)]
    longer = ContextState(length, len(bounds), state.config, keys, caches,
                          {name: grown(name, part) for name, part in state.parts.items()})
    if keep_hidden:
        longer.hidden = torch.empty(length, model.residual_width, dtype=model.dtype, device=model.device)
        longer.hidden[: point.at] = state.hidden[: point.at]
        longer.rows = state.rows.carried() if state.rows is not None else None
    return _encode_chunks(model, longer, bounds, lambda start, end: context_ids[start:end], skip=point.n_chunks)


def run_steps(steps: Generator[None, None, ContextState]) -> ContextState:
    """Run a stepwise encoding (`encode_in_steps`) to its end: its ContextState."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def _encode_chunks(model: TruncatedLM, state: ContextState, bounds: list[tuple[int, int]],
                   inputs: Callable[[int, int], torch.Tensor], first: int = 1, skip: int = 0,
                   below: ResumePoint | None = None) -> Generator[None, None, ContextState]:
    """The context chunks from number `skip` on through layers first..top, a step (one layer of one chunk) per
    `next`; inputs(start, end): the chunk's ids (T,) when first = 1, else its residual stream entering layer
    `first` (T, D), whose lower layers' resume point is `below` (the state's resume point is then made of it and
    of the layers run here; None there: the state has none). Before a last chunk cut short, the window caches
    are copied: that is where a longer context takes the prefill on."""
    config = state.config
    full = config.chunk + (config.sink if len(bounds) == 1 else 0)  # the last chunk's length, were it not cut
    ends_short = bool(bounds) and bounds[-1][1] - bounds[-1][0] < full
    lower = first == 1 or below is not None
    for index, (start, end) in enumerate(bounds):
        if index < skip:
            continue
        if ends_short and index == len(bounds) - 1 > 0 and lower:
            held = (below.caches or state.caches[: first - 1]) if below is not None else []
            state.resume = ResumePoint(start, index, [*(c.snapshot() for c in held),
                                                      *(c.snapshot() for c in state.caches[first - 1:])])
        yield from _context_chunk(model, state, inputs(start, end), start, index, first)
    if bounds and not ends_short and lower:
        state.resume = ResumePoint(state.length, len(bounds))
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
    if not state.has_windows:
        raise ValueError("state: its window caches were not kept (ContextState.keys_only): encode it again")
    queries, found, stream = _query_chunk(model, state, query_ids, tuple(parts))
    return RetrievalState(keys=score_keys(model, state), queries=queries, parts={**state.parts, **found}, stream=stream)


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
                   first: int = 1) -> Generator[None, None, None]:
    """Context chunk number `index` (ids (T,) at positions start.., or with first > 1 its residual stream
    entering layer `first`, (T, D)) through layers first..top, yielding after each layer: writes its keys at
    every score layer and, at l_R, the parts the state keeps; appends its K/V
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
            state.keys[l][:, start:end] = got.pop("keys")
            if head:
                got["retaining"] = model.retaining_head.score(*(got[p] for p in HEAD_INPUTS))
            for name in state.parts:
                state.parts[name][:, start:end] = got[name]
            return
        q, k, v = layer.qkv(h, cos, sin)  # (H, T, d), (KV, T, d), (KV, T, d)
        if l in state.keys and not (first > 1 and l == first):  # a resumed pass keeps its first layer's keys
            state.keys[l][:, start:end] = k
        if l == top:
            layer.drop(h)
            return
        cache = state.caches[l - 1]
        out = cache.attend(q, k, v, sink_shift, model.inv_freq)
        cache.append(k, v, first=index == 0)
        h = layer.finish(h, out)
        yield


def _query_chunk(model: TruncatedLM, state: ContextState, ids: torch.Tensor, parts: tuple[str, ...]
                 ) -> tuple[dict[int, torch.Tensor], dict[str, torch.Tensor], torch.Tensor]:
    """The query (ids (Lq,)) as chunk N_C after the context, through layers 1..top against the state's
    window caches, which it reads and leaves as they were: its queries (heads, Lq, d) at every score
    layer, at l_R the query `parts` asked for, and its residual stream entering the top layer (Lq, D)."""
    l_r, top = model.n_layers, max(state.keys)
    h, cos, sin, sink_shift = _chunk_inputs(model, state, ids, state.length, state.n_chunks)
    queries: dict[int, torch.Tensor] = {}
    for l in range(1, top + 1):
        layer = model.layer(l)
        if l == l_r:
            got = layer.parts(h, cos, sin, ("queries", *parts))
            queries[l] = got.pop("queries")
            return queries, got, h
        q, k, v = layer.qkv(h, cos, sin)
        if l in state.keys:
            queries[l] = q
        if l == top:
            layer.drop(h)
            break
        h = layer.finish(h, state.caches[l - 1].attend(q, k, v, sink_shift, model.inv_freq))
    return queries, {}, h
