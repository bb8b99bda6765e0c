"""A longer context that shares a cached one's tokens takes its prefill on (`extend_context`): the extended
encoding is the fresh encoding of the longer context, every tensor equal, in float32, for a context that ends
on a chunk boundary or inside a chunk, additions shorter than a chunk, exactly one and many, DCA on and off,
a bounded window and none."""

from __future__ import annotations

import pytest
import torch

from ilre.compressor.context_state import ContextState, chunk_bounds
from ilre.compressor.prefill import encode_context, extend_context, extend_in_steps, prefill_query, resume_context
from ilre.kernels.rope import keys_as_read
from tests.tiny_models import N_LAYERS, random_ids

from .test_context_state import CONFIGS, model
from .test_resume import assert_same_state

# CONFIGS[0] and [1]: sink 2, chunk 7 (the first chunk 9 tokens): 23 ends on a boundary, 20 inside a chunk
PREFIXES = [9, 20, 23]
ADDED = [3, 7, 30]  # shorter than a chunk, one chunk, many


def assert_same_reading(got: ContextState, want: ContextState, layers: tuple[int, ...]) -> None:
    """The same state, and a query reads the same keys and states from both (DCA's moves included)."""
    assert_same_state(got, want)
    assert (got.resume.at, got.resume.n_chunks) == (want.resume.at, want.resume.n_chunks)
    query = random_ids(4, seed=77)
    a, b = prefill_query(model(), got, query), prefill_query(model(), want, query)
    for layer in layers:
        assert torch.equal(keys_as_read(a.keys[layer]), keys_as_read(b.keys[layer]))
        assert torch.equal(a.queries[layer], b.queries[layer])


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("added", ADDED)
def test_an_extended_encoding_equals_the_fresh_encoding(config, prefix, added):
    context = random_ids(prefix + added, seed=5)
    layers, parts = (2, N_LAYERS), ("values", "raw_keys")
    cached = encode_context(model(), context[:prefix], config, layers, parts=parts)
    extended = extend_context(model(), cached, context)
    assert_same_reading(extended, encode_context(model(), context, config, layers, parts=parts), layers)


@pytest.mark.parametrize("config", CONFIGS)
def test_the_resume_point_is_the_last_chunk_a_longer_context_runs_the_same_way(config):
    for length in (5, 9, 20, 23, 40):
        state = encode_context(model(), random_ids(length, seed=1), config, (2,))
        bounds = chunk_bounds(length, config)
        whole = bounds[-1][1] - bounds[-1][0] == config.chunk + (config.sink if len(bounds) == 1 else 0)
        if len(bounds) == 1 and not whole:
            assert state.resume is None  # inside the first chunk: a longer context runs that chunk otherwise
            with pytest.raises(ValueError, match="nothing to extend"):
                extend_context(model(), encode_context(model(), random_ids(5, seed=1), config, (2,)),
                               random_ids(30, seed=1))
            continue
        at = length if whole else bounds[-1][0]
        assert (state.resume.at, state.resume.n_chunks) == (at, len(bounds) if whole else len(bounds) - 1)
        assert (state.resume.caches is None) == whole  # a copy of the window caches only where they moved on
        if not whole:
            assert state.nbytes - state.resume.nbytes == sum(
                t.numel() * t.element_size() for t in state.keys.values()) + sum(c.nbytes for c in state.caches)


@pytest.mark.parametrize("config", CONFIGS)
def test_extending_again_and_from_stored_tensors(config):
    """A conversation: each turn extends the last one's encoding; one turn comes from a store's tensors (what a
    worker that did not encode the prefix reads from the shared tier)."""
    context = random_ids(70, seed=8)
    state = encode_context(model(), context[:12], config, (N_LAYERS,))
    for end in (20, 31, 52, 70):
        stored = ContextState.from_tensors(model(), config, state.to_tensors()) if end == 31 else state
        state = extend_context(model(), stored, context[:end])
        assert_same_reading(state, encode_context(model(), context[:end], config, (N_LAYERS,)), (N_LAYERS,))


@pytest.mark.parametrize("config", CONFIGS)
def test_a_shallow_encoding_extends_and_is_then_taken_deeper(config):
    """The cascade's coarse encoding extends with its stream at the top, and the extension goes deeper
    (`resume_context`) to what a fresh deep encoding holds, resume point included."""
    context = random_ids(48, seed=9)
    shallow = encode_context(model(), context[:20], config, (2,), keep_hidden=True)
    longer = extend_context(model(), shallow, context, keep_hidden=True)
    fresh = encode_context(model(), context, config, (2,), keep_hidden=True)
    assert_same_reading(longer, fresh, (2,))
    assert torch.equal(longer.hidden, fresh.hidden)
    deep = resume_context(model(), longer, (2, N_LAYERS), parts=("values",))
    assert_same_reading(deep, encode_context(model(), context, config, (2, N_LAYERS), parts=("values",)), (2, N_LAYERS))
    with pytest.raises(ValueError, match="no stream at the top"):
        extend_context(model(), encode_context(model(), context[:20], config, (2,)), context, keep_hidden=True)


def test_extending_runs_only_the_new_chunks():
    config = CONFIGS[0]
    state = encode_context(model(), random_ids(23, seed=2), config, (2,))  # 3 chunks: 9 + 7 + 7
    steps = extend_in_steps(model(), state, random_ids(44, seed=2))  # 3 more: 7 + 7 + 7
    count = 0
    while True:
        try:
            next(steps)
        except StopIteration:
            break
        count += 1
    assert count == 3 * 1  # one layer below the top per chunk
