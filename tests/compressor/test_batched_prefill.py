"""Batched prefill of short requests against the one-request streaming prefill."""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from ilre.compressor.batched_prefill import batched_prefill, fits_one_chunk
from ilre.compressor.prefill import streaming_prefill
from ilre.compressor.prefill_config import PrefillConfig
from tests.tiny_models import N_LAYERS, random_ids, single_thread, tiny_checkpoint  # noqa: F401
from ilre.kernels.rope import keys_as_read
from ilre.models.loader import load_truncated

CONFIGS = {
    "window_shorter_than_context": PrefillConfig(sink=2, window=5, chunk=24),
    "window_longer_than_context": PrefillConfig(sink=3, window=40, chunk=24),
    "unbounded": PrefillConfig(sink=2, window=None, chunk=24),
    "no_sink": PrefillConfig(sink=0, window=4, chunk=26),
}
# contexts of different lengths, shorter than the sink, exactly one chunk, and queries of different lengths
LENGTHS = [(1, 3), (2, 1), (7, 4), (15, 2), (26, 5), (20, 3)]


@lru_cache(maxsize=None)
def model(kind: str):
    return load_truncated(tiny_checkpoint(kind), N_LAYERS)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_batched_prefill_equals_one_by_one(kind, config_name):
    config = CONFIGS[config_name]
    contexts = [random_ids(n, seed=10 + i) for i, (n, _) in enumerate(LENGTHS)]
    queries = [random_ids(m, seed=50 + i) for i, (_, m) in enumerate(LENGTHS)]
    assert all(fits_one_chunk(c.numel(), config) for c in contexts)
    # lower layers' keys and queries too, as the default blends layer l_c's attention; a coarse layer alone, as
    # the default's candidate stage reads
    for layers in ((1, N_LAYERS - 1, N_LAYERS), (N_LAYERS - 1,)):
        batched = batched_prefill(model(kind), contexts, queries, config, layers)
        for context, query, got in zip(contexts, queries, batched):
            alone = streaming_prefill(model(kind), context, query, config, layers)
            assert set(got.keys) == set(got.queries) == set(layers)
            for layer in layers:
                torch.testing.assert_close(keys_as_read(got.keys[layer]), keys_as_read(alone.keys[layer]), atol=2e-5, rtol=1e-5)
                torch.testing.assert_close(got.queries[layer], alone.queries[layer], atol=2e-5, rtol=1e-5)


def test_batched_prefill_rejects_long_contexts_and_layers_not_below_l_r():
    config = PrefillConfig(sink=2, window=4, chunk=8)
    with pytest.raises(ValueError, match="chunk \\+ sink = 10"):
        batched_prefill(model("llama"), [random_ids(11, 0)], [random_ids(2, 1)], config)
    with pytest.raises(ValueError, match=f"layer: score layers must be within 1..{N_LAYERS}"):
        batched_prefill(model("llama"), [random_ids(5, 0)], [random_ids(2, 1)], config, (N_LAYERS + 1,))
