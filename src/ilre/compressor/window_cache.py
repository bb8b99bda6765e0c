"""The sink and sliding-window K/V cache of one layer below l_R (the streaming prefill's memory)."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from ..kernels.chunk_attention import chunk_attention
from ..kernels.masked_attention import masked_attention, sliding_attention
from ..kernels.rope import rerotate
from ..models.llama import TruncatedLM
from ..models.spec import CHUNKED, SLIDING
from .prefill_config import PrefillConfig


def ring_size(held: int, chunk: int) -> int:
    """The ring of an unbounded window (W = None) holding `held` tokens: one chunk, doubled until they fit."""
    size = chunk
    while size < held:
        size *= 2
    return size


class WindowCache:
    """Sink and sliding-window K/V of one layer below l_R, in one preallocated buffer per tensor.

    k, v: (kv_heads, S + W + slot, d) laid out as [sink | window ring | current chunk]. Attention
    does not depend on the order of the keys it sees, so the window is a ring: a chunk overwrites
    the oldest entries in place and nothing is re-concatenated. The chunk (or the query) is
    written behind the ring, so attention reads one contiguous view. With W = None the ring holds
    the whole context: it starts at one chunk and doubles when full (`ring_size`), so what a chunk
    computes depends on the tokens before it only, never on how long the context will be (a longer
    context's prefill goes on from a shorter one's). `sink_raw` keeps the sink keys at their own positions
    (DCA moves a copy). Once the context is encoded, `freeze` keeps only the live entries:
    (kv_heads, n_sink + n_window, d).
    `layer` (1-based) names the layer of a model whose layers differ (models/transformers_lm.py's `attention_rule`):
    a sliding or chunked layer keeps no sink and the model's own window, and a layer that the sink + window rule
    alone does not state (those, sink logits, narrower values) attends through an explicit mask of positions
    (`seen`: the context tokens taken so far).
    """

    def __init__(self, config: PrefillConfig, slot: int, model: TruncatedLM, held: int = 0, layer: int | None = None):
        spec = model.spec
        rule = model.attention_rule(layer) if layer is not None and hasattr(model, "attention_rule") else None
        self.layer = layer
        self.rule = None if rule is None or (rule.plain and rule.v_dim == rule.head_dim) else rule
        self.inv_freq = getattr(rule, "inv_freq", None)  # the layer's own RoPE frequencies (DCA's move of the sink)
        if self.rule is not None and self.rule.kind in (SLIDING, CHUNKED):
            config = replace(config, sink=0, window=max(1, self.rule.window - 1))
        self.growing = config.window is None
        self.chunk = config.chunk
        self.sink, self.window = config.sink, config.window or ring_size(held, config.chunk)
        heads, k_dim, v_dim = ((rule.kv_heads, rule.head_dim, rule.v_dim) if rule is not None else
                               (spec.num_kv_heads, spec.head_dim, spec.value_dim))
        rows = self.sink + self.window + slot
        self.k = torch.zeros((heads, rows, k_dim), dtype=model.dtype, device=model.device)  # zeros: masked holes
        self.v = torch.zeros((heads, rows, v_dim), dtype=model.dtype, device=model.device)  # must not carry NaNs
        self.sink_raw: torch.Tensor | None = None
        self.n_sink = self.n_window = self.ring_at = self.seen = 0
        self.sink_shift: int | None = None
        self.frozen = False

    @property
    def nbytes(self) -> int:
        """Bytes held: the K/V buffers and the sink's unmoved keys."""
        tensors = [self.k, self.v] + ([self.sink_raw] if self.sink_raw is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Replace the K/V buffers and the sink's unmoved keys by `fn` of each (e.g. the same values elsewhere)."""
        self.k, self.v = fn(self.k), fn(self.v)
        self.sink_raw = fn(self.sink_raw) if self.sink_raw is not None else None

    def freeze(self) -> None:
        """The context is done: keep only what a query reads, [sink | window] without the chunk slot
        or a short context's holes, (kv_heads, n_sink + n_window, d). A frozen cache takes no more
        context chunks; a query attends through a copy (the prefix plus its own K/V)."""
        if not self.frozen:
            self.k, self.v = self._live()
            self.frozen = True

    def _live(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The live K and V, [sink | window] without slot or holes: (kv_heads, n_sink + n_window, d) each (the
        buffers themselves once frozen)."""
        if self.frozen:
            return self.k, self.v
        ring = slice(self.sink, self.sink + self.n_window)
        return tuple(torch.cat((t[:, : self.n_sink], t[:, ring]), dim=1) for t in (self.k, self.v))

    def snapshot(self) -> "WindowCache":
        """A frozen copy of the live entries as they are now (the cache itself goes on unchanged)."""
        if self.sink_raw is None:
            raise RuntimeError("an empty window cache has nothing to copy")
        live_k, live_v = self._live()
        copy = WindowCache.__new__(WindowCache)
        copy.sink, copy.window, copy.n_sink, copy.n_window = self.sink, self.window, self.n_sink, self.n_window
        copy.growing, copy.chunk = self.growing, self.chunk
        copy.ring_at, copy.sink_shift, copy.frozen = self.ring_at, self.sink_shift, True
        copy.rule, copy.seen, copy.layer, copy.inv_freq = self.rule, self.seen, self.layer, self.inv_freq
        copy.k, copy.v, copy.sink_raw = live_k.clone(), live_v.clone(), self.sink_raw.clone()
        return copy

    def thawed(self, config: PrefillConfig, model: TruncatedLM) -> "WindowCache":
        """This frozen cache opened again for the chunks of a longer context: a new cache laid out as the encoding
        of that context has it at this point ([sink | ring | chunk slot], holes zero), so that the next chunks
        compute exactly what they compute there."""
        opened = WindowCache(config, config.chunk, model, held=self.n_window, layer=self.layer)
        opened.seen = self.seen
        opened.k[:, : self.n_sink] = self.k[:, : self.n_sink]
        opened.v[:, : self.n_sink] = self.v[:, : self.n_sink]
        ring = slice(opened.sink, opened.sink + self.n_window)
        opened.k[:, ring] = self.k[:, self.n_sink : self.n_sink + self.n_window]
        opened.v[:, ring] = self.v[:, self.n_sink : self.n_sink + self.n_window]
        opened.sink_raw = self.sink_raw.clone()
        opened.n_sink, opened.n_window, opened.ring_at, opened.sink_shift = (self.n_sink, self.n_window, self.ring_at,
                                                                             self.sink_shift)
        return opened

    @classmethod
    def restored(cls, config: PrefillConfig, model: TruncatedLM, k: torch.Tensor, v: torch.Tensor,
                 sink_raw: torch.Tensor, counters: list[int], layer: int | None = None) -> "WindowCache":
        """A frozen cache from stored tensors: k/v (kv_heads, n_sink + n_window, d) as `freeze` left them
        (or, as stored before, (kv_heads, S + W, d) with holes), counters (n_sink, n_window, ring_at, sink_shift
        [, seen]); `layer` as in the constructor."""
        cache = cls.__new__(cls)
        ruled = layer is not None and hasattr(model, "attention_rule")
        shell = cls(config, 0, model, layer=layer) if ruled else None  # the layer's rule and window
        cache.rule, cache.layer = (shell.rule if shell is not None else None), layer
        cache.inv_freq = shell.inv_freq if shell is not None else None
        if cache.rule is not None:
            config = replace(config, sink=shell.sink, window=shell.window)
        cache.sink, cache.growing, cache.chunk = config.sink, config.window is None, config.chunk
        cache.window = config.window or ring_size(counters[1], config.chunk)
        cache.n_sink, cache.n_window, cache.ring_at, shift = counters[:4]
        cache.seen = counters[4] if len(counters) > 4 else 0
        cache.sink_shift = None if shift < 0 else shift
        if k.shape[1] != cache.n_sink + cache.n_window:  # the older layout: [sink | ring] with holes
            ring = slice(cache.sink, cache.sink + cache.n_window)
            k = torch.cat((k[:, : cache.n_sink], k[:, ring]), dim=1)
            v = torch.cat((v[:, : cache.n_sink], v[:, ring]), dim=1)
        place = {"device": model.device, "dtype": model.dtype}
        cache.k, cache.v, cache.sink_raw = k.to(**place), v.to(**place), sink_raw.to(**place)
        cache.frozen = True
        return cache

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink_shift: int,
               inv_freq: torch.Tensor) -> torch.Tensor:
        """q: (H, C, d), k/v: (KV, C, d) of a chunk -> (H, C, d): attention over sink, window and
        the chunk itself (causally)."""
        if self.sink_raw is not None and sink_shift != self.sink_shift:
            self.k[:, : self.n_sink] = rerotate(self.sink_raw, inv_freq if self.inv_freq is None else self.inv_freq,
                                                sink_shift)
            self.sink_shift = sink_shift
        if self.rule is not None:
            return self._masked(q, k, v)
        if self.sink_raw is None:  # the first chunk sees only itself
            return chunk_attention(q, k, v, 0)
        if self.frozen:  # live entries only, no slot: the chunk goes behind a copy of them
            prefix = self.k.shape[1]
            return chunk_attention(q, torch.cat((self.k, k), dim=1), torch.cat((self.v, v), dim=1), prefix)
        prefix, n = self.sink + self.window, k.shape[1]
        if prefix + n > self.k.shape[1]:  # a query longer than the slot: widen it, keeping the prefix
            self.k = torch.cat((self.k[:, :prefix], torch.zeros_like(self.k[:, :1]).expand(-1, n, -1)), dim=1)
            self.v = torch.cat((self.v[:, :prefix], torch.zeros_like(self.v[:, :1]).expand(-1, n, -1)), dim=1)
        self.k[:, prefix : prefix + n] = k
        self.v[:, prefix : prefix + n] = v
        visible = None
        if self.n_sink < self.sink or self.n_window < self.window:  # short inputs: holes in the prefix
            visible = torch.zeros(prefix, dtype=torch.bool, device=q.device)
            visible[: self.n_sink] = True
            visible[self.sink : self.sink + self.n_window] = True
        return chunk_attention(q, self.k[:, : prefix + n], self.v[:, : prefix + n], prefix, visible)

    def _masked(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """`attend` under this layer's rule: every entry at its position, the chunk's rows at seen, seen + 1, ...;
        a sliding layer sees its window, a chunked one its own chunk, sink logits where the layer has them."""
        device, n = q.device, q.shape[-2]
        rows = torch.arange(self.seen, self.seen + n, device=device)
        keys, values, at = k, v, rows
        if self.sink_raw is not None:
            live_k, live_v = self._live()
            slots = torch.arange(self.n_window, device=device)
            ring = self.seen - 1 - torch.remainder(self.ring_at - 1 - slots, self.window)
            keys, values = torch.cat((live_k, k), dim=1), torch.cat((live_v, v), dim=1)
            at = torch.cat((torch.arange(self.n_sink, device=device), ring, rows))
        if self.rule.kind == SLIDING:
            return sliding_attention(q, keys, values, at, rows, self.rule.window, self.rule.sinks)
        visible = at.unsqueeze(0) <= rows.unsqueeze(1)
        if self.rule.kind == CHUNKED:
            visible &= (at // self.rule.window).unsqueeze(0) == (rows // self.rule.window).unsqueeze(1)
        return masked_attention(q, keys, values, visible, self.rule.sinks)

    def append(self, k: torch.Tensor, v: torch.Tensor, first: bool) -> None:
        """Keep a context chunk's K/V (KV, C, d): the first S context tokens become the sink, later
        tokens enter the ring, which keeps the last W."""
        if self.frozen:
            raise RuntimeError("a frozen window cache takes no more context chunks")
        self.seen += k.shape[1]
        if first:
            self.sink_raw = k[:, : self.sink].clone()
            self.n_sink = self.sink_raw.shape[1]
            self.k[:, : self.n_sink] = self.sink_raw
            self.v[:, : self.n_sink] = v[:, : self.sink]
            self.sink_shift = 0
            k, v = k[:, self.sink :], v[:, self.sink :]
        if self.growing and self.n_window + k.shape[1] > self.window:
            self._grow(ring_size(self.n_window + k.shape[1], self.chunk))
        k, v = k[:, -self.window :], v[:, -self.window :]
        n, at = k.shape[1], self.ring_at
        head = min(n, self.window - at)  # entries before the ring wraps
        ring = slice(self.sink, self.sink + self.window)
        self.k[:, ring][:, at : at + head] = k[:, :head]
        self.v[:, ring][:, at : at + head] = v[:, :head]
        self.k[:, ring][:, : n - head] = k[:, head:]
        self.v[:, ring][:, : n - head] = v[:, head:]
        self.ring_at = (at + n) % self.window
        self.n_window = min(self.window, self.n_window + n)

    def _grow(self, size: int) -> None:
        """An unbounded window's ring widened to `size` entries, the live ones where they were (no wrap yet)."""
        slot = self.k.shape[1] - self.sink - self.window
        for name in ("k", "v"):
            old = getattr(self, name)
            new = old.new_zeros((old.shape[0], self.sink + size + slot, old.shape[2]))
            new[:, : self.sink + self.n_window] = old[:, : self.sink + self.n_window]
            setattr(self, name, new)
        self.window, self.ring_at = size, self.n_window  # a full ring's next entry had wrapped to 0
