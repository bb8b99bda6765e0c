"""ILRe's `also_layers`: lower layers' query attention joins l_R's, against a dense reference."""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from tests.selecting import select_context, select_query
from ilre.compressor.prefill import encode_context
from ilre.compressor.prefill_config import PrefillConfig
from ilre.compressor.strategies import make_strategy
from ilre.models.loader import load_truncated
from tests.reference import dense_prefill, dense_scores, literal_algorithm1
from tests.tiny_models import N_LAYERS, random_ids, single_thread, tiny_checkpoint  # noqa: F401

LENGTH, N_QUERY, KERNELS = 70, 5, ((2, 4), (1, 3))


@lru_cache(maxsize=None)
def model():
    return load_truncated(tiny_checkpoint("qwen2"), N_LAYERS)


def reference_kept(context, query, config: PrefillConfig, layers: tuple[int, ...], budget: int,
                   weight: float = 1.0) -> list[int]:
    """Each layer's A^C from a dense masked prefill, scaled to sum 1 outside the sink (and by `weight` below
    the last layer, l_R), element-wise max, then Algorithm 1 loop by loop after the sink."""
    per_layer = []
    for layer in layers:
        keys, queries = dense_prefill(model(), context, query, config, layer)
        scores = dense_scores(queries, keys)
        per_layer.append(scores / scores[config.sink:].sum() * (1.0 if layer == layers[-1] else weight))
    combined = torch.stack(per_layer).amax(dim=0)[config.sink:].tolist()
    picked = literal_algorithm1(combined, budget - config.sink, *KERNELS)
    return list(range(config.sink)) + [i + config.sink for i in picked]


def ilre_with(**options):
    """The ILRe strategy with the test's pooling kernels and the given options."""
    return make_strategy("ilre", {"max_kernels": list(KERNELS[0]), "avg_kernels": list(KERNELS[1]), **options})


@pytest.mark.parametrize("config", [PrefillConfig(sink=4, window=8, chunk=16), PrefillConfig(sink=4, window=8, chunk=16, dca=True)])
@pytest.mark.parametrize("also, budget", [((1,), 20), ((1, 2), 33), ((2,), 9)])
def test_also_layers_match_the_dense_reference(config, also, budget):
    context, query = random_ids(LENGTH, seed=4), random_ids(N_QUERY, seed=5)
    strategy = ilre_with(also_layers=list(also))  # also_weight 0.5, the default
    kept = select_context(model(), context, query, budget, strategy, config).kept.tolist()
    assert kept == reference_kept(context, query, config, (*also, N_LAYERS), budget, 0.5)


@pytest.mark.parametrize("weight", [1.0, 0.1])
def test_also_weight_scales_the_lower_layers_against_the_dense_reference(weight):
    context, query = random_ids(LENGTH, seed=8), random_ids(N_QUERY, seed=9)
    config = PrefillConfig(sink=4, window=8, chunk=16, dca=True)
    strategy = ilre_with(also_layers=[1, 2], also_weight=weight)
    kept = select_context(model(), context, query, 20, strategy, config).kept.tolist()
    assert kept == reference_kept(context, query, config, (1, 2, N_LAYERS), 20, weight)
    other = ilre_with(also_layers=[1, 2], also_weight=0.5 if weight == 1.0 else 1.0)
    assert kept != select_context(model(), context, query, 20, other, config).kept.tolist()  # the weight changed the choice


def test_without_also_layers_the_scores_are_l_r_attention_alone():
    context, query = random_ids(LENGTH, seed=6), random_ids(N_QUERY, seed=7)
    config = PrefillConfig(sink=4, window=8, chunk=16)
    plain = ilre_with()
    assert select_context(model(), context, query, 20, plain, config).kept.tolist() == \
        reference_kept(context, query, config, (N_LAYERS,), 20)


def test_bad_layers_name_the_option():
    with pytest.raises(ValueError, match="also_layers: must be an integer >= 1"):
        make_strategy("ilre", {"also_layers": [0]})
    with pytest.raises(ValueError, match="also_layers: must be a list"):
        make_strategy("ilre", {"also_layers": 3})
    for weight in (0, 1.5, "half", True):
        with pytest.raises(ValueError, match=r"also_weight: must be a number > 0 and <= 1"):
            make_strategy("ilre", {"also_layers": [1], "also_weight": weight})
    strategy = make_strategy("ilre", {"also_layers": [N_LAYERS]})
    with pytest.raises(ValueError, match=f"also_layers: every layer must be below l_R = {N_LAYERS}"):
        select_context(model(), random_ids(LENGTH, seed=1), random_ids(N_QUERY, seed=2), 20, strategy, PrefillConfig(sink=4, window=8, chunk=16))


def test_an_encoded_context_without_the_layer_is_refused():
    config = PrefillConfig(sink=4, window=8, chunk=16)
    strategy = make_strategy("ilre", {"also_layers": [1]})
    context = random_ids(LENGTH, seed=1)
    state = encode_context(model(), context, config)  # l_R's keys only
    with pytest.raises(ValueError, match=r"reads layers \[1\] that the encoded context lacks"):
        select_query(model(), state, random_ids(N_QUERY, seed=2), 20, strategy, context)
    assert strategy.reading().batchable and make_strategy("ilre").reading().batchable  # the batched prefill keeps lower layers too
