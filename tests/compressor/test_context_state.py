"""One encoded context, many queries: encode_context + select against select_context per query."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import pytest
import torch

from ilre.compressor.context_state import ContextState
from tests.selecting import select_context, select_query
from ilre.compressor.prefill import encode_context, prefill_query, streaming_prefill
from ilre.compressor.prefill_config import PrefillConfig
from ilre.compressor.strategies import ScoreInputs, Strategy, make_strategy
from ilre.kernels.rope import keys_as_read
from ilre.models.loader import load_truncated
from tests.tiny_models import N_LAYERS, random_ids, single_thread, tiny_checkpoint  # noqa: F401

CONFIGS = [PrefillConfig(sink=2, window=5, chunk=7), PrefillConfig(sink=2, window=5, chunk=7, dca=True),
           PrefillConfig(sink=3, window=None, chunk=6)]


@lru_cache(maxsize=None)
def model(kind: str = "qwen3"):
    return load_truncated(tiny_checkpoint(kind), N_LAYERS)


def snapshot(state) -> list[torch.Tensor]:
    """Everything a later query reads: the keys, each cache's sink (as stored: the buffer's copy is
    re-rotated for each chunk under DCA) and its window."""
    return ([k.clone() for k in state.keys.values()] + [c.sink_raw.clone() for c in state.caches]
            + [c.v.clone() for c in state.caches] + [c.k[:, c.n_sink:].clone() for c in state.caches])


@pytest.mark.parametrize("config", CONFIGS)
def test_queries_against_one_encoded_context_equal_fresh_prefills(config):
    context = random_ids(45, seed=1)
    queries = [random_ids(n, seed=10 + n) for n in (3, 1, 12, 4)]  # 12 > chunk: the slot grows
    state = encode_context(model(), context, config, score_layers=(2, N_LAYERS))
    before = snapshot(state)
    for query in queries:
        got = prefill_query(model(), state, query)
        fresh = streaming_prefill(model(), context, query, config, score_layers=(2, N_LAYERS))
        for layer in (2, N_LAYERS):
            torch.testing.assert_close(got.queries[layer], fresh.queries[layer], atol=0, rtol=0)
            torch.testing.assert_close(keys_as_read(got.keys[layer]), keys_as_read(fresh.keys[layer]), atol=0, rtol=0)
    for kept, now in zip(before, snapshot(state)):
        assert torch.equal(kept, now)  # a query pass leaves the encoded context as it was


@pytest.mark.parametrize("strategy", ["ilre", "snapkv"])
def test_select_from_one_context_equals_select_context(strategy):
    config = PrefillConfig(sink=2, window=5, chunk=7, dca=True)
    context = random_ids(60, seed=2)
    state = encode_context(model("llama"), context, config)
    for seed, budget in ((20, 9), (21, 17), (22, 30), (23, 60)):
        query = random_ids(4, seed=seed)
        got = select_query(model("llama"), state, query, budget, make_strategy(strategy), context)
        alone = select_context(model("llama"), context, query, budget, make_strategy(strategy), config)
        assert got.kept.tolist() == alone.kept.tolist() and got.passthrough == alone.passthrough
    assert state.nbytes > 0


@pytest.mark.parametrize("config", CONFIGS)
def test_state_through_tensors_serves_the_same_queries(config):
    context = random_ids(45, seed=3)
    state = encode_context(model(), context, config, score_layers=(2, N_LAYERS))
    tensors = {name: t.clone() for name, t in state.to_tensors().items()}
    restored = ContextState.from_tensors(model(), config, tensors)
    assert restored.length == state.length and restored.n_chunks == state.n_chunks
    for query in (random_ids(3, seed=30), random_ids(12, seed=31)):
        got, want = prefill_query(model(), restored, query), prefill_query(model(), state, query)
        for layer in (2, N_LAYERS):
            assert torch.equal(got.queries[layer], want.queries[layer])
            assert torch.equal(keys_as_read(got.keys[layer]), keys_as_read(want.keys[layer]))


@dataclass(frozen=True)
class KeyNorm(Strategy):
    """A query-agnostic strategy that needs the prefill: the norm of each token's l_R key."""

    name = "key_norm"
    needs_query = False
    calls: list = field(default_factory=list, compare=False, repr=False)

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        assert inputs.attention is None and not inputs.state.queries  # no query was run
        self.calls.append(inputs.length)
        return next(iter(inputs.state.keys.values())).float().norm(dim=-1).amax(dim=0)


def test_query_agnostic_scores_are_computed_once_per_context():
    config = PrefillConfig(sink=2, window=5, chunk=7)
    context = random_ids(60, seed=4)
    strategy = KeyNorm()
    state = encode_context(model("llama"), context, config)
    picks = [select_query(model("llama"), state, random_ids(4, seed=s), 20, strategy, context).kept.tolist() for s in (40, 41, 42)]
    assert len(strategy.calls) == 1 and picks[0] == picks[1] == picks[2]
    fresh = select_context(model("llama"), context, random_ids(4, seed=43), 20, KeyNorm(), config)
    assert fresh.kept.tolist() == picks[0]
    assert strategy.memo_key in state.scores


@pytest.mark.parametrize("length", [2, 4, 9, 45])  # below S, S + a few (< S + W), above S + W
@pytest.mark.parametrize("config", CONFIGS[:2])
def test_encoded_state_holds_exactly_the_live_entries(config, length):
    """A cached document costs what a later query reads: per layer below l_R min(L, S) sink plus
    min(L - S, W) window entries (and the sink's unmoved keys), the l_R keys of all L tokens; no chunk
    slot, no holes; plus, where the context ends inside a chunk, the same window entries as they stood before
    it (the resume point, tests/compressor/test_extend.py). Restored from its tensors, it serves the same
    queries as a fresh prefill."""
    context = random_ids(length, seed=40 + length)
    state = encode_context(model(), context, config, score_layers=(2, N_LAYERS))
    live = min(length, config.sink) + min(max(0, length - config.sink), config.window)
    entry = 2 * model().spec.num_kv_heads * model().spec.head_dim * model().dtype.itemsize
    for cache in state.caches:
        assert cache.k.shape[1] == cache.v.shape[1] == live
    keys = sum(k.numel() * k.element_size() for k in state.keys.values())
    sinks = sum(c.sink_raw.numel() * c.sink_raw.element_size() for c in state.caches)
    resume = state.resume.nbytes if state.resume is not None else 0
    assert state.nbytes == keys + len(state.caches) * live * entry + sinks + resume
    tensors = {name: t.clone() for name, t in state.to_tensors().items()}
    counts = ("meta", "resume")
    assert sum(t.numel() * t.element_size() for t in tensors.values()) - sum(tensors[n].nbytes for n in counts if n in tensors) \
        - sum(t.nbytes for n, t in tensors.items() if n.endswith("counters")) == state.nbytes
    restored = ContextState.from_tensors(model(), config, tensors)
    for query in (random_ids(3, seed=50), random_ids(12, seed=51)):
        fresh = streaming_prefill(model(), context, query, config, score_layers=(2, N_LAYERS))
        for got in (prefill_query(model(), state, query), prefill_query(model(), restored, query)):
            for layer in (2, N_LAYERS):
                torch.testing.assert_close(got.queries[layer], fresh.queries[layer], atol=0, rtol=0)


def test_states_stored_in_the_older_layout_still_restore():
    """Entries a shared store kept from before (each cache's [sink | window] at S + W with holes)."""
    config = CONFIGS[1]
    context = random_ids(9, seed=60)
    state = encode_context(model(), context, config)
    tensors = {name: t.clone() for name, t in state.to_tensors().items()}
    for i, cache in enumerate(state.caches):
        for name in ("k", "v"):
            old = torch.zeros(cache.k.shape[0], config.sink + config.window, cache.k.shape[2], dtype=cache.k.dtype)
            live = tensors[f"cache.{i}.{name}"]
            old[:, : cache.n_sink] = live[:, : cache.n_sink]
            old[:, config.sink : config.sink + cache.n_window] = live[:, cache.n_sink :]
            tensors[f"cache.{i}.{name}"] = old
    restored = ContextState.from_tensors(model(), config, tensors)
    query = random_ids(4, seed=61)
    want = prefill_query(model(), state, query).queries[N_LAYERS]
    assert torch.equal(prefill_query(model(), restored, query).queries[N_LAYERS], want)
