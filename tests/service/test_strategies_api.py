"""LagKV and ReAttention by name over real gRPC and HTTP: options, a request without a query for
the query-agnostic one, and bad options naming their field."""

from __future__ import annotations

import pytest

from ilre.contract.messages import CompressRequest
from ilre.service.client import ClientError

from .conftest import QUERY, comparable, context, grpc_client, http_client


def test_lagkv_needs_no_query_over_http_and_grpc(local_service, engine):
    body = {"context": context(7, repeats=8), "budget": 120, "strategy": "lagkv", "strategy_options": {"lag": 32}}
    with http_client(local_service) as http:
        reply = http.post("/v1/compress", json=body)
        with_query = http.post("/v1/compress", json={**body, "query": QUERY}).json()
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["query"] == "" and data["compressed_tokens"] == 120 and len(data["token_ids"]) == 120
    assert with_query["kept_indices"] == data["kept_indices"]  # the query changes nothing but the tail
    expected = engine.compress(CompressRequest(**body))
    with grpc_client(local_service) as client:
        assert comparable(client.compress(body["context"], None, budget=120, strategy="lagkv",
                                          strategy_options={"lag": 32})) == comparable(expected)
        with pytest.raises(ClientError) as err:  # a strategy that reads the query still needs one
            client.compress(body["context"], None, budget=120, strategy="ilre")
    assert err.value.code == "INVALID_ARGUMENT" and err.value.field == "query"


def test_reattention_by_name_with_options(local_service, engine):
    with grpc_client(local_service) as client:
        result = client.compress(context(8, repeats=8), QUERY, budget=96, strategy="reattention",
                                 strategy_options={"span": 8, "local_tokens": 16})
        expected = engine.compress(CompressRequest(context=context(8, repeats=8), query=QUERY, budget=96,
                                                   strategy="reattention", strategy_options={"span": 8, "local_tokens": 16}))
        assert comparable(result) == comparable(expected) and result.compressed_tokens == 96
        with pytest.raises(ClientError) as err:
            client.compress(context(8), QUERY, strategy="reattention", strategy_options={"span": 0})
    assert err.value.field == "strategy_options.span" and "must be an integer >= 1" in err.value.message


def test_locret_needs_no_query_and_actqkv_reports_its_automatic_budget(local_service, engine):
    body = {"context": context(9, repeats=8), "budget": 120, "strategy": "locret"}
    with http_client(local_service) as http:
        reply = http.post("/v1/compress", json=body)
        auto = http.post("/v1/compress", json={"context": context(9, repeats=8), "query": QUERY, "budget": 120,
                                               "strategy": "actqkv", "strategy_options": {"auto_budget": True}}).json()
        bad = http.post("/v1/compress", json={**body, "strategy_options": {"stabilisers": -1}})
        headless = http.post("/v1/compress", json={**body, "layer": 5})  # no head trained for layer 5
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["query"] == "" and data["compressed_tokens"] == data["budget"] == 120
    assert data["layer"] in engine.head_layers()  # no layer asked: where its head is stored
    assert comparable(engine.compress(CompressRequest(**body))) == comparable(data)
    assert 30 <= auto["budget"] <= 120 and auto["compressed_tokens"] == auto["budget"] == len(auto["kept_indices"])
    assert bad.status_code == 400 and bad.json()["field"] == "strategy_options.stabilisers"
    assert headless.status_code == 400 and headless.json()["field"] == "strategy"
    assert "ilre train-locret --layer 5" in headless.json()["error"] and "layer 8" in headless.json()["error"]
    with grpc_client(local_service) as client:
        result = client.compress(context(9, repeats=8), QUERY, budget=120, strategy="actqkv",
                                 strategy_options={"auto_budget": True})
        with pytest.raises(ClientError) as err:
            client.compress(context(9, repeats=8), None, budget=120, strategy="locret", layer=5)
    assert result.budget == auto["budget"] and result.kept_indices == auto["kept_indices"]
    assert err.value.code == "INVALID_ARGUMENT" and err.value.field == "strategy"
    assert "ilre train-locret --layer 5" in err.value.message


def test_a_request_names_a_layer_of_the_profile(local_service, engine):
    choices = engine.profile.choices
    with http_client(local_service) as http:
        info = http.get("/v1/model").json()
        named = http.post("/v1/compress", json={"context": context(3, repeats=6), "query": QUERY, "budget": 64,
                                                "layer": "default"}).json()
        unknown = http.post("/v1/compress", json={"context": context(3), "query": QUERY, "layer": "fastest"})
    assert info["layer_choices"] == choices and choices["default"] == engine.layer
    assert named["layer"] == engine.layer
    assert unknown.status_code == 400 and unknown.json()["field"] == "layer"
    assert "'fastest' is not a layer the profile" in unknown.json()["error"] and "default (" in unknown.json()["error"]
    with grpc_client(local_service) as client:
        result = client.compress(context(3, repeats=6), QUERY, budget=64, layer="default")
        assert result.layer == engine.layer and result.kept_indices == named["kept_indices"]
        info = client.model_info()
        assert info.layer_choices == choices and info.default_strategy == "cascade"
        assert info.default_strategy_options == engine.profile.strategy_options("cascade") == {
            "coarse_layer": 8, "candidates": 4.0, "coarse_weight": 0.5, "deepen_below": 0.0,
            "coarse_below": 0.0}


def test_a_retaining_head_strategy_without_a_layer_runs_where_its_head_is():
    from ilre.compressor.strategies import make_strategy
    from ilre.engine.engine import Engine, EngineConfig

    engine = Engine(EngineConfig(layer=12))  # no head is stored for layer 12
    heads = engine.head_layers()
    assert heads and 12 not in heads
    nearest = min(heads, key=lambda l: (abs(l - 12), l))
    assert engine.strategy_layer(make_strategy("locret"), None) == nearest
    assert engine.strategy_layer(make_strategy("locret"), 5) == 5  # a layer asked for is kept (and refused later)
    assert engine.strategy_layer(make_strategy("ilre"), None) == 12
    result = engine.compress(CompressRequest(context=context(9, repeats=8), budget=120, strategy="locret"))
    assert result.layer == nearest and result.compressed_tokens == 120


@pytest.mark.parametrize("layer", [6, "fast"])
def test_the_default_at_a_layer_not_above_its_coarse_layer_is_plain_ilre_there(engine, layer):
    """The profile's coarse layer (8) cannot pick candidates for l_R <= 8: the default runs as plain ILRe."""
    fields = {"context": context(3, repeats=12), "query": QUERY, "budget": 40, "layer": layer}
    default = engine.compress(CompressRequest(**fields))
    plain = engine.compress(CompressRequest(**fields, strategy="ilre"))
    assert default.strategy == "cascade" and default.layer == plain.layer <= 8
    assert default.original_tokens > 4 * 40 and default.kept_indices == plain.kept_indices
    with pytest.raises(Exception, match="coarse_layer: must be below l_R"):  # unless the request asks for it
        engine.compress(CompressRequest(**fields, strategy_options={"coarse_layer": 8}))


def test_the_default_is_the_profiles_cascade(engine):
    import torch

    from tests.selecting import select_context
    from ilre.compressor.prefill_config import PrefillConfig
    from ilre.compressor.strategies import make_strategy

    fields = {"context": context(3, repeats=40), "query": QUERY, "budget": 64, "granularity": "token"}
    default = engine.compress(CompressRequest(**fields))
    assert default.strategy == "cascade" and default.layer == engine.layer and default.original_tokens > 4 * 64
    ids = torch.tensor(engine.tokenizer(fields["context"], add_special_tokens=False).input_ids)
    query = torch.tensor(engine.tokenizer(QUERY, add_special_tokens=False).input_ids)
    # the suite's servers run with `--deepen off` (tests/conftest.py): a first question's candidates from layer 1
    cascade = make_strategy("cascade", {"coarse_layer": 8, "candidates": 4.0, "coarse_weight": 0.5, "deepen_below": 0.0,
                                        "coarse_below": 0.0, "first_from_stream": False})
    with torch.inference_mode():
        direct = select_context(engine.model_at(engine.layer), ids, query, 64, cascade, PrefillConfig(dca=default.dca))
    assert default.kept_indices == direct.kept.tolist()
