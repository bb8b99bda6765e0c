"""A shallow encoding taken deeper (`resume_context`) is the deep encoding itself: every tensor a later query
reads equals a fresh `encode_context` to the deeper layers, exactly, in float32."""

from __future__ import annotations

import pytest
import torch

from ilre.compressor.context_state import chunk_bounds
from ilre.compressor.prefill import encode_context, prefill_query, resume_context, resume_in_steps
from tests.tiny_models import N_LAYERS, random_ids

from .test_context_state import CONFIGS, model, snapshot


def assert_same_state(got, want) -> None:
    assert sorted(got.keys) == sorted(want.keys) and got.length == want.length and got.n_chunks == want.n_chunks
    assert len(got.caches) == len(want.caches) and sorted(got.parts) == sorted(want.parts)
    for a, b in zip(snapshot(got), snapshot(want)):
        assert torch.equal(a, b)
    for name in want.parts:
        assert torch.equal(got.parts[name], want.parts[name])
    for a, b in zip(got.caches, want.caches):
        assert (a.n_sink, a.n_window, a.ring_at) == (b.n_sink, b.n_window, b.ring_at)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("length", [5, 9, 45])  # inside the first chunk, one chunk and a bit, many chunks
@pytest.mark.parametrize("coarse", [1, 2, 3])
def test_a_resumed_encoding_equals_the_deep_encoding(config, length, coarse):
    context = random_ids(length, seed=30 + length)
    shallow = encode_context(model(), context, config, (coarse,), keep_hidden=True)
    assert shallow.hidden is not None and shallow.hidden.shape == (length, model().spec.hidden_size)
    deep = resume_context(model(), shallow, (coarse, N_LAYERS), parts=("values",))
    fresh = encode_context(model(), context, config, (coarse, N_LAYERS), parts=("values",))
    assert_same_state(deep, fresh)
    assert deep.hidden is None
    query = random_ids(5, seed=99)
    got, want = prefill_query(model(), deep, query), prefill_query(model(), fresh, query)
    for layer in (coarse, N_LAYERS):
        assert torch.equal(got.queries[layer], want.queries[layer])


def test_the_shallow_encoding_reads_the_same_with_or_without_its_resume_point():
    config, context = CONFIGS[1], random_ids(45, seed=3)
    kept = encode_context(model(), context, config, (2,), keep_hidden=True)
    plain = encode_context(model(), context, config, (2,))
    assert_same_state(kept, plain)
    assert kept.nbytes - plain.nbytes == kept.hidden.numel() * kept.hidden.element_size()
    assert kept.take_hidden() is not None and kept.hidden is None and kept.nbytes == plain.nbytes
    assert set(kept.to_tensors()) == set(plain.to_tensors())  # the resume point is never stored


def test_resuming_steps_one_layer_of_one_chunk_at_a_time():
    config = CONFIGS[0]  # chunk 7, sink 2: 45 tokens are 6 chunks
    shallow = encode_context(model(), random_ids(45, seed=4), config, (2,), keep_hidden=True)
    steps = resume_in_steps(model(), shallow, (2, N_LAYERS))
    count = 0
    while True:
        try:
            next(steps)
            count += 1
        except StopIteration:
            break
    assert count == len(chunk_bounds(45, config)) * (N_LAYERS - 2)  # layers 2, 3 of each chunk; 4 (l_R): keys only


def test_bad_resumes_name_what_is_wrong():
    config, context = CONFIGS[0], random_ids(20, seed=5)
    with pytest.raises(ValueError, match="keep_hidden"):
        resume_context(model(), encode_context(model(), context, config, (2,)), (2, N_LAYERS))
    shallow = encode_context(model(), context, config, (2,), keep_hidden=True)
    with pytest.raises(ValueError, match="layer"):
        resume_context(model(), shallow, (N_LAYERS,))  # drops layer 2's keys
    with pytest.raises(ValueError, match="layer"):
        resume_context(model(), shallow, (1, 2))  # not deeper
