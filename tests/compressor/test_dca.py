"""Dual chunk attention (eqs. 6-7) against a dense reference that places keys by RoPE directly."""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from ilre.compressor.context_state import chunk_bounds
from ilre.compressor.prefill import streaming_prefill
from ilre.compressor.prefill_config import PrefillConfig
from ilre.kernels.rope import keys_as_read, rerotate
from ilre.models.loader import load_truncated
from tests.reference import dense_prefill
from tests.tiny_models import N_LAYERS, random_ids, single_thread, tiny_checkpoint  # noqa: F401

N_QUERY = 3
SMALL = PrefillConfig(sink=2, window=5, chunk=7, dca=True)
SPANNING = PrefillConfig(sink=3, window=12, chunk=5, dca=True)


@lru_cache(maxsize=None)
def model(kind: str):
    return load_truncated(tiny_checkpoint(kind), N_LAYERS)


def run(kind, length, config, dca):
    cfg = PrefillConfig(config.sink, config.window, config.chunk, dca)
    context, query = random_ids(length, seed=length + 7), random_ids(N_QUERY, seed=8)
    state = streaming_prefill(model(kind), context, query, cfg)
    return keys_as_read(state.keys[N_LAYERS]), state.queries[N_LAYERS], (context, query, cfg)


@pytest.mark.parametrize("kind", ["llama", "llama3", "qwen2_yarn", "qwen3"])
@pytest.mark.parametrize("config", [SMALL, SPANNING], ids=["small", "spanning"])
@pytest.mark.parametrize("length", [8, 13, 23, 51])  # 1, 2, 3 and 7 chunks for SMALL
def test_dca_streaming_equals_dense_reference(kind, config, length):
    keys, queries, (context, query, cfg) = run(kind, length, config, dca=True)
    ref_keys, ref_queries = dense_prefill(model(kind), context, query, cfg)
    # keys sit at positions up to ~L + 100 shifted; float32 RoPE angles: a few 1e-5 absolute
    torch.testing.assert_close(keys, ref_keys, atol=5e-5, rtol=1e-5)
    torch.testing.assert_close(queries, ref_queries, atol=5e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["llama", "qwen2_yarn"])
def test_dca_changes_hidden_states_from_the_third_chunk(kind):
    # the dense DCA reference is not vacuous: chunk 3 (0-based 2) sees a rotated sink in layers < l_R
    length = 23  # chunks [0,9) [9,16) [16,23)
    on, _, (context, query, cfg) = run(kind, length, SMALL, dca=True)
    off, _, _ = run(kind, length, SMALL, dca=False)
    assert (on[:, 16:] - off[:, 16:]).abs().max() > 1e-2
    ref_off, _ = dense_prefill(model(kind), context, query, PrefillConfig(2, 5, 7, dca=False))
    assert (on[:, 16:] - ref_off[:, 16:]).abs().max() > 1e-2


@pytest.mark.parametrize("kind", ["llama", "llama3", "qwen2_yarn"])
@pytest.mark.parametrize("length", [23, 30, 51])
def test_dca_first_chunks_are_the_plain_keys_moved_to_chunk_nc_minus_1(kind, length):
    # Chunks 1 and 2 (1-based) never see a rotated sink, so with DCA their keys are exactly the
    # plain keys re-rotated by eq. 7 onto the start of chunk N_C - 1.
    on, _, (_, _, cfg) = run(kind, length, SMALL, dca=True)
    off, _, _ = run(kind, length, SMALL, dca=False)
    bounds = chunk_bounds(length, cfg)
    assert len(bounds) >= 3
    base = bounds[-2][0]
    inv_freq = model(kind).inv_freq
    for start, end in bounds[: min(2, len(bounds) - 2)]:
        moved = rerotate(off[:, start:end], inv_freq, base - start)
        torch.testing.assert_close(on[:, start:end], moved, atol=2e-5, rtol=1e-5)
    # the last two chunks are not re-rotated; for a 3-chunk context chunk 2 still equals DCA off
    if len(bounds) == 3:
        torch.testing.assert_close(on[:, bounds[1][0] : bounds[1][1]], off[:, bounds[1][0] : bounds[1][1]])


@pytest.mark.parametrize("kind", ["llama", "qwen2_yarn"])
@pytest.mark.parametrize("length", [5, 9, 13, 16])  # one or two chunks
def test_dca_with_at_most_two_chunks_leaves_context_keys_unchanged(kind, length):
    on, q_on, _ = run(kind, length, SMALL, dca=True)
    off, q_off, _ = run(kind, length, SMALL, dca=False)
    assert torch.equal(on, off)
    if len(chunk_bounds(length, SMALL)) == 1:
        assert torch.equal(q_on, q_off)
    else:
        # the query is prefilled as chunk 3: it sees the sink moved by one chunk (eq. 6)
        assert not torch.allclose(q_on, q_off, atol=1e-3)
