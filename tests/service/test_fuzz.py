"""Fuzzing the request fields (hypothesis) through the JSON mirror and gRPC of a real server:
every answer is a result or INVALID_ARGUMENT naming a field; no crash, no hang (each call has a
deadline, so a hang would surface as DEADLINE_EXCEEDED and fail the test)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ilre.service.client import ClientError

from .conftest import grpc_client, http_client

FIELDS = ("id", "context", "context_ids", "query", "query_ids", "budget", "ratio", "strategy",
          "strategy_options", "dca", "layer")
text = st.text(max_size=300)
ids = st.lists(st.integers(min_value=-5, max_value=60000), max_size=200)
number = st.one_of(st.integers(-10, 10 ** 6), st.floats(allow_nan=True, allow_infinity=True), st.booleans())
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 40), 2 ** 40), st.floats(), st.text(max_size=20))
json_value = st.recursive(json_scalar, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                          max_leaves=10)
strategy_name = st.one_of(st.sampled_from(["ilre", "snapkv", "streaming_llm", "", "ILRE"]), st.text(max_size=10))
options = st.dictionaries(st.sampled_from(["kernel_size", "max_kernels", "avg_kernels", "x"]),
                          st.one_of(st.integers(-3, 40), st.lists(st.integers(-3, 20), max_size=4), json_value),
                          max_size=2)
FIELD_VALUES = {
    "id": st.one_of(st.text(max_size=10), st.integers(), json_value),
    "context": st.one_of(text, json_value), "context_ids": st.one_of(ids, json_value),
    "query": st.one_of(text, json_value), "query_ids": st.one_of(ids, json_value),
    "budget": st.one_of(number, json_value), "ratio": st.one_of(number, json_value),
    "strategy": st.one_of(strategy_name, json_value), "strategy_options": st.one_of(options, json_value),
    "dca": st.one_of(st.sampled_from(["auto", "on", "off"]), st.text(max_size=5), json_value),
    "layer": st.one_of(st.integers(-2, 40), json_value),
}


@st.composite
def json_requests(draw):
    """Mostly plausible requests (so that many reach the model), some of anything."""
    chosen = draw(st.sets(st.sampled_from(FIELDS), max_size=len(FIELDS)))
    data = {name: draw(FIELD_VALUES[name]) for name in chosen}
    if draw(st.booleans()):
        data.setdefault("context", draw(st.text(min_size=1, max_size=300)))
        data.setdefault("query", draw(st.text(min_size=1, max_size=40)))
    if draw(st.integers(0, 9)) == 0:
        data[draw(st.text(max_size=6))] = draw(json_value)
    return data


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True,
                database=None)


@pytest.fixture(scope="module")
def http(local_service):
    with http_client(local_service) as h:
        yield h


@FUZZ
@given(data=json_requests())
def test_fuzz_json_mirror(http, data):
    body = json.dumps(data, allow_nan=True)  # NaN and Infinity too: Python's JSON reads them
    reply = http.post("/v1/compress", content=body, headers={"x-request-timeout": "120", "content-type": "application/json"})
    assert reply.status_code in (200, 400), reply.text
    body = reply.json()
    if reply.status_code == 400:
        assert body["code"] == "INVALID_ARGUMENT" and body["field"] is not None  # "" for an unknown key ""
        assert body["error"].startswith(f"{body['field']}:") and "Traceback" not in body["error"]
    else:
        assert body["compressed_tokens"] == len(body["kept_indices"]) <= body["original_tokens"]


int64 = st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1)
wire_fields = st.fixed_dictionaries({}, optional={
    "id": st.text(max_size=10), "context": text, "context_ids": st.lists(int64, max_size=100),
    "query": text, "query_ids": st.lists(st.integers(-5, 60000), max_size=40),
    "budget": int64, "ratio": st.floats(allow_nan=True, allow_infinity=True), "strategy": strategy_name,
    "strategy_options": st.dictionaries(st.sampled_from(["kernel_size", "max_kernels", "x"]),
                                        st.one_of(st.integers(-3, 40), st.lists(st.integers(-3, 20), max_size=3),
                                                  st.text(max_size=5), st.booleans()), max_size=2),
    "dca": st.one_of(st.sampled_from(["auto", "on", "off"]), st.text(max_size=5)), "layer": int64,
})


@FUZZ
@given(fields=wire_fields)
def test_fuzz_grpc(local_service, fields):
    if "context" in fields and "context_ids" in fields:
        fields.pop("context_ids")  # a oneof on the wire
    if "query" in fields and "query_ids" in fields:
        fields.pop("query_ids")
    if "budget" in fields and "ratio" in fields:
        fields.pop("ratio")
    with grpc_client(local_service) as client:
        try:
            result = client.compress(**fields)
        except ClientError as exc:
            assert exc.code == "INVALID_ARGUMENT", exc
            assert exc.field and exc.message.startswith(f"{exc.field}:")
        else:
            assert result.compressed_tokens == len(result.kept_indices) <= result.original_tokens
