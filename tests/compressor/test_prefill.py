"""Streaming chunked prefill against a dense whole-sequence forward with an explicit Λ mask."""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from ilre.compressor.context_state import chunk_bounds
from ilre.compressor.prefill import streaming_prefill
from ilre.compressor.prefill_config import PrefillConfig
from ilre.kernels.query_scores import query_key_scores
from ilre.kernels.rope import keys_as_read
from ilre.models.loader import load_truncated
from tests.reference import dense_prefill, dense_scores, lambda_mask
from tests.tiny_models import N_LAYERS, random_ids, single_thread, tiny_checkpoint  # noqa: F401

N_QUERY = 3
CONFIGS = {
    "small": PrefillConfig(sink=2, window=5, chunk=7),
    "default_ratio": PrefillConfig(sink=4, window=8, chunk=16),  # S:W:chunk like 4:512:1024
    "window_spans_chunks": PrefillConfig(sink=2, window=12, chunk=5),
    "no_sink": PrefillConfig(sink=0, window=3, chunk=4),
    "unbounded": PrefillConfig(sink=3, window=None, chunk=6),
}


@lru_cache(maxsize=None)
def model(kind: str, layers: int = N_LAYERS):
    return load_truncated(tiny_checkpoint(kind), layers)


def test_chunk_bounds_first_chunk_holds_the_sink():
    config = PrefillConfig(sink=2, window=5, chunk=7)
    assert chunk_bounds(1, config) == [(0, 1)]
    assert chunk_bounds(9, config) == [(0, 9)]
    assert chunk_bounds(10, config) == [(0, 9), (9, 10)]
    assert chunk_bounds(30, config) == [(0, 9), (9, 16), (16, 23), (23, 30)]
    assert chunk_bounds(0, config) == []


def test_lambda_mask_hand_example():
    # sink 1, window 1, chunks [0,3) [3,5), query [5,8)
    got = lambda_mask(8, sink=1, window=1, bounds=[(0, 3), (3, 5)]).int().tolist()
    expected = [
        [1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0],
        [1, 0, 1, 1, 0, 0, 0, 0],  # chunk 2: sink 0, window {2}, itself
        [1, 0, 1, 1, 1, 0, 0, 0],
        [1, 0, 0, 0, 1, 1, 0, 0],  # query: sink 0, window {4}, itself causally
        [1, 0, 0, 0, 1, 1, 1, 0],
        [1, 0, 0, 0, 1, 1, 1, 1],
    ]
    assert got == expected


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("length", [1, 9, 30, 51])
def test_streaming_equals_dense_lambda_mask(kind, config_name, length):
    config = CONFIGS[config_name]
    lm = model(kind)
    context, query = random_ids(length, seed=length), random_ids(N_QUERY, seed=100)
    state = streaming_prefill(lm, context, query, config)
    keys, queries = dense_prefill(lm, context, query, config)  # (KV, L, d), (H, Lq, d)
    assert keys_as_read(state.keys[N_LAYERS]).shape == keys.shape
    assert state.queries[N_LAYERS].shape == queries.shape
    torch.testing.assert_close(keys_as_read(state.keys[N_LAYERS]), keys, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(state.queries[N_LAYERS], queries, atol=2e-5, rtol=1e-5)
    scores = query_key_scores(state.queries[N_LAYERS], state.keys[N_LAYERS], block=8)  # (L,)
    torch.testing.assert_close(scores.double(), dense_scores(queries, keys), atol=1e-6, rtol=1e-4)


def test_window_matters_so_the_comparison_is_sensitive():
    # W=3 vs W=None must give different layer-l_R keys from the second chunk on
    lm = model("llama")
    context, query = random_ids(30, seed=30), random_ids(N_QUERY, seed=100)
    narrow = streaming_prefill(lm, context, query, PrefillConfig(sink=2, window=3, chunk=7))
    wide = streaming_prefill(lm, context, query, PrefillConfig(sink=2, window=None, chunk=7))
    narrow_keys, wide_keys = keys_as_read(narrow.keys[N_LAYERS]), keys_as_read(wide.keys[N_LAYERS])
    torch.testing.assert_close(narrow_keys[:, :9], wide_keys[:, :9])  # first chunk
    assert (narrow_keys[:, 9:] - wide_keys[:, 9:]).abs().max() > 1e-2


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_several_score_layers_in_one_pass_equal_separate_passes(kind):
    config = CONFIGS["small"]
    context, query = random_ids(30, seed=3), random_ids(N_QUERY, seed=4)
    together = streaming_prefill(model(kind), context, query, config, score_layers=(3, 1, 2, N_LAYERS))
    assert sorted(together.keys) == sorted(together.queries) == [1, 2, 3, N_LAYERS]
    for layer in (1, 2, 3, N_LAYERS):
        alone = streaming_prefill(model(kind), context, query, config, score_layers=(layer,))
        assert list(alone.keys) == [layer]
        truncated = streaming_prefill(model(kind, layer), context, query, config)  # l_R = layer
        for other in (alone, truncated):
            torch.testing.assert_close(keys_as_read(together.keys[layer]), keys_as_read(other.keys[layer]), atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(together.queries[layer], other.queries[layer], atol=1e-6, rtol=1e-6)
        keys, queries = dense_prefill(model(kind), context, query, config, layer=layer)
        torch.testing.assert_close(keys_as_read(together.keys[layer]), keys, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(together.queries[layer], queries, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("layers", [(0,), (N_LAYERS + 1,), (1, N_LAYERS + 1)])
def test_score_layers_out_of_range(layers):
    with pytest.raises(ValueError, match="layer"):
        streaming_prefill(model("llama"), random_ids(5, 0), random_ids(2, 1), CONFIGS["small"], score_layers=layers)


@pytest.mark.parametrize(
    "kwargs, field", [({"sink": -1}, "sink"), ({"window": 0}, "window"), ({"chunk": 0}, "chunk")]
)
def test_prefill_config_names_bad_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        PrefillConfig(**kwargs)
