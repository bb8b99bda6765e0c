"""What the streaming prefill (prefill.py) hands on: the encoded context (`ContextState`) with its resume point,
and one query's keys and states (`RetrievalState`).

A ContextState is query-independent and can be stored (`to_tensors`) and extended: its `ResumePoint` is the
state at the end of the last context chunk that a longer context sharing the same tokens would run the same way
(every chunk but a last one cut short), from which `prefill.extend_context` goes on with the new chunks only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..kernels.rope import MovedKeys
from ..models.llama import TruncatedLM
from .candidate_rows import RowMemo
from .prefill_config import PrefillConfig
from .window_cache import WindowCache


# per-token extras of the context a strategy may ask for at l_R: values and raw_keys (kv_heads, L, d) and
# raw_queries (heads, L, d) in the model's dtype; retaining (kv_heads, L, 1) float32, the predictions of
# the model's Locret retaining head (the others are what that head reads, and trains on)
CONTEXT_PARTS = ("values", "raw_keys", "raw_queries", "retaining")
STATE_PARTS = ("keys", "parts", "windows", "scores", "stream", "rows", "resume")  # ContextState.part_bytes
QUERY_PARTS = ("raw_queries",)  # and of the query
HEAD_INPUTS = ("raw_queries", "raw_keys", "values")  # what the retaining head reads


def part_shape(name: str, model: TruncatedLM, length: int) -> tuple[tuple[int, int, int], torch.dtype]:
    """(shape, dtype) of a context part's cache for a context of `length` tokens."""
    spec = model.spec
    if name == "retaining":
        return (spec.num_kv_heads, length, 1), torch.float32
    heads = spec.num_heads if name == "raw_queries" else spec.num_kv_heads
    return (heads, length, spec.value_dim if name == "values" else spec.head_dim), model.dtype


def empty_part(name: str, model: TruncatedLM, length: int) -> torch.Tensor:
    """An uninitialised cache for a context part ("keys" or one of CONTEXT_PARTS) of `length` tokens."""
    shape, dtype = part_shape(name, model, length)
    return torch.empty(shape, dtype=dtype, device=model.device)


@dataclass
class RetrievalState:
    """keys[l]: (kv_heads, L, d) context keys at score layer l (MovedKeys if DCA moves them: `keys_as_read`);
    queries[l]: (heads, Lq, d) query states at score layer l; parts: the extras asked for at l_R:
    values, raw_keys (kv_heads, L, d: before RoPE, so never moved by DCA), raw_queries (heads, Lq, d);
    stream: (Lq, D) the query's residual stream entering the top encoded layer (None where not made);
    context_stream: (L, D) the context's, where the batched prefill kept it (a one-chunk context's first question)."""

    keys: dict[int, torch.Tensor | MovedKeys]
    queries: dict[int, torch.Tensor]
    parts: dict[str, torch.Tensor] = field(default_factory=dict)
    stream: torch.Tensor | None = None
    context_stream: torch.Tensor | None = None


def chunk_bounds(length: int, config: PrefillConfig) -> list[tuple[int, int]]:
    """[start, end) of each context chunk: the first holds chunk + sink tokens, the rest chunk."""
    bounds, start = [], 0
    end = min(length, config.chunk + config.sink)
    while start < length:
        bounds.append((start, end))
        start, end = end, min(length, end + config.chunk)
    return bounds


@dataclass
class ResumePoint:
    """Where a longer context sharing this one's tokens takes the prefill on: after `at` tokens, the first
    `n_chunks` chunks (the chunks a longer context runs the same way: all but a last one cut short). caches: each
    layer's frozen window cache at that point, or None when it is the state's own (the context ends on a chunk
    boundary: nothing more is held)."""

    at: int
    n_chunks: int
    caches: list[WindowCache] | None = None

    @property
    def nbytes(self) -> int:
        """Bytes held besides the state's own: the window caches at the point, where they differ."""
        return sum(c.nbytes for c in self.caches or ())


@dataclass
class ContextState:
    """The query-independent part of the prefill, as it stands at the end of the context.

    keys[l]: (kv_heads, L, d) context keys at each score layer l, each at its own position (DCA's moves are
    made when a query reads them: `score_keys`, so that a longer context's keys extend these); caches[l-1]:
    the sink and window K/V of layer l < top, frozen once the context is encoded (`WindowCache.freeze`:
    the live entries only; a query attends through a copy of them plus its own K/V); length: L;
    n_chunks: N_C. Any number of queries can be run against it one after another (`prefill_query`);
    a query pass may re-rotate the sink keys in place (DCA), so passes run one at a time.
    parts: the CONTEXT_PARTS encoded at l_R (shapes: `part_shape`); scores: (L,) scores of
    query-agnostic strategies, memoised by `Strategy.memo_key`; hidden: (L, D) in the model's dtype, the
    residual stream entering the top layer for every context token, kept only when asked
    (`encode_context(keep_hidden=True)`): from it `resume_context` takes the encoding deeper without
    layers 1..top-1 (never stored: `to_tensors` leaves it out). rows: where the cascade's candidate passes over this
    context leave their rows while it keeps its stream (compressor/candidate_rows.py; `row_memo`; never stored either).
    resume: where a longer context that shares
    these tokens takes the prefill on (`prefill.extend_context`), None where nothing can be taken on.
    """

    length: int
    n_chunks: int
    config: PrefillConfig
    keys: dict[int, torch.Tensor]
    caches: list[WindowCache]
    parts: dict[str, torch.Tensor] = field(default_factory=dict)
    scores: dict[str, torch.Tensor] = field(default_factory=dict)
    hidden: torch.Tensor | None = None
    resume: ResumePoint | None = None
    rows: RowMemo | None = None

    @property
    def top(self) -> int:
        """The deepest layer encoded: l_R, or the top of a shallower encoding (a cascade's coarse layer)."""
        return max(self.keys)

    @property
    def nbytes(self) -> int:
        """Memory held: the key caches, the extra parts, the window buffers, the memoised scores, the stream at
        the top (`hidden`) where kept, the candidate rows and the resume point's own window caches."""
        return sum(self.part_bytes().values())

    def part_bytes(self) -> dict[str, int]:
        """`nbytes` by what holds it (STATE_PARTS): keys (the score layers'), parts (CONTEXT_PARTS), windows (the
        sink and window K/V below the top), scores, stream (`hidden`), rows, resume (the resume point's own
        windows)."""
        def size(tensors) -> int:
            return sum(t.numel() * t.element_size() for t in tensors)

        return {"keys": size(self.keys.values()), "parts": size(self.parts.values()),
                "windows": sum(c.nbytes for c in self.caches), "scores": size(self.scores.values()),
                "stream": size([self.hidden] if self.hidden is not None else []),
                "rows": self.rows.nbytes if self.rows is not None else 0,
                "resume": self.resume.nbytes if self.resume is not None else 0}

    @property
    def has_windows(self) -> bool:
        """Whether the state holds the window caches a query pass reads (`keys_only` drops them)."""
        return len(self.caches) >= self.top - 1

    def keys_only(self) -> "ContextState":
        """The same encoding without what only a query pass against it or a longer context reads: its keys and
        parts (the same tensors), no window caches, stream, rows or resume point. A question asked of several
        contexts at once runs once and is moved to each (compressor/shared_query.py), so it reads no more."""
        return ContextState(self.length, self.n_chunks, self.config, dict(self.keys), [], dict(self.parts))

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Replace every tensor the state holds (keys, parts, scores, hidden, window caches, the resume point's
        own caches) by `fn` of it, e.g. the same values in other memory. Done before any query reads the state:
        a query's DCA pass re-rotates sink keys in place."""
        for held in (self.keys, self.parts, self.scores):  # in place: a state made from this one shares them
            for name, t in held.items():
                held[name] = fn(t)
        self.hidden = fn(self.hidden) if self.hidden is not None else None
        for cache in [*self.caches, *(self.resume.caches or () if self.resume is not None else ())]:
            cache.map_tensors(fn)

    def take_hidden(self) -> torch.Tensor | None:
        """The resume point, removed from the state (which a document cache may then keep without it), and the
        candidate rows with it (no pass starts from the stream then)."""
        hidden, self.hidden, self.rows = self.hidden, None, None
        return hidden

    def row_memo(self) -> RowMemo | None:
        """Where candidate passes over this context leave their rows for the next (made on first ask, from the
        encoding's top layer up), while the state keeps its stream; None when it keeps none."""
        if self.hidden is None:
            return None
        if self.rows is None:
            self.rows = RowMemo(self.top)
        return self.rows

    def to_tensors(self) -> dict[str, torch.Tensor]:
        """What a later query reads, as named contiguous tensors (a document store saves them):
        "meta" (length, n_chunks); "keys.{l}" (kv_heads, L, d); "part.{name}"; per cache i below l_R
        "cache.{i}.k|v" (kv_heads, n_sink + n_window, d): the live entries, "cache.{i}.sink_raw" and
        "cache.{i}.counters" (n_sink, n_window, ring_at, sink_shift); the resume point: "resume" (at, n_chunks)
        and, where they differ from the state's, its caches as "resume.{i}.k|v|sink_raw|counters". Memoised
        scores are left out (cheap to redo)."""
        out = {"meta": torch.tensor([self.length, self.n_chunks], dtype=torch.int64)}
        out.update({f"keys.{layer}": k.contiguous() for layer, k in self.keys.items()})
        out.update({f"part.{name}": t.contiguous() for name, t in self.parts.items()})
        for i, cache in enumerate(self.caches):
            out.update(_cache_tensors(f"cache.{i}", cache))
        if self.resume is not None:
            out["resume"] = torch.tensor([self.resume.at, self.resume.n_chunks], dtype=torch.int64)
            for i, cache in enumerate(self.resume.caches or ()):
                out.update(_cache_tensors(f"resume.{i}", cache))
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
        state = cls(length, n_chunks, config, keys, _restored_caches("cache", config, model, tensors), parts)
        if "resume" in tensors:
            at, chunks = (int(x) for x in tensors["resume"].tolist())
            state.resume = ResumePoint(at, chunks, _restored_caches("resume", config, model, tensors) or None)
        return state


def score_keys(model: TruncatedLM, state: ContextState) -> dict[int, torch.Tensor | MovedKeys]:
    """The context keys as a query scores them: state.keys, or with DCA (eq. 7) read moved (`dca_spans`; MovedKeys:
    the scores move the query instead, nothing is copied). keys[l]: (kv_heads, L, d)."""
    spans = dca_spans(state.length, state.config)
    if not spans:
        return state.keys
    return {layer: MovedKeys(keys, spans, model.inv_freq) for layer, keys in state.keys.items()}


def dca_spans(length: int, config: PrefillConfig) -> tuple[tuple[int, int, int], ...]:
    """DCA's key moves (eq. 7) for a context of `length`: (start, end, shift) for every chunk i < N_C - 2, moved to
    the start of chunk N_C - 2 so that every query-key distance stays under two chunk lengths; () without DCA or
    with fewer than three chunks."""
    bounds = chunk_bounds(length, config)
    if not config.dca or len(bounds) < 3:
        return ()
    base = bounds[-2][0]
    return tuple((start, end, base - start) for start, end in bounds[:-2])


def _cache_tensors(prefix: str, cache: WindowCache) -> dict[str, torch.Tensor]:
    """A window cache as named tensors (frozen first): {prefix}.k|v|sink_raw|counters."""
    if not isinstance(cache, WindowCache):
        raise ValueError("state: a layer without attention keeps a recurrent state that is not stored as tensors")
    cache.freeze()
    shift = -1 if cache.sink_shift is None else cache.sink_shift
    return {f"{prefix}.k": cache.k.contiguous(), f"{prefix}.v": cache.v.contiguous(),
            f"{prefix}.sink_raw": cache.sink_raw.contiguous(),
            f"{prefix}.counters": torch.tensor([cache.n_sink, cache.n_window, cache.ring_at, shift, cache.seen])}


def _restored_caches(prefix: str, config: PrefillConfig, model: TruncatedLM,
                     tensors: dict[str, torch.Tensor]) -> list[WindowCache]:
    """The window caches `_cache_tensors` wrote under {prefix}.0, {prefix}.1, ..."""
    caches: list[WindowCache] = []
    while f"{prefix}.{len(caches)}.k" in tensors:
        name = f"{prefix}.{len(caches)}"
        caches.append(WindowCache.restored(config, model, tensors[f"{name}.k"], tensors[f"{name}.v"],
                                           tensors[f"{name}.sink_raw"],
                                           [int(x) for x in tensors[f"{name}.counters"].tolist()],
                                           layer=len(caches) + 1))
    return caches
