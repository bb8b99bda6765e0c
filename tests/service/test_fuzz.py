"""Fuzzing the request fields (hypothesis) through the JSON mirror and gRPC of a real server:
every answer is a result or INVALID_ARGUMENT naming a field; no crash, no hang (each call has a
deadline, so a hang would surface as DEADLINE_EXCEEDED and fail the test)."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ilre.service.client import ClientError

from ilre.service.common.config import SidecarConfig
from ilre.service.server import ServiceThread

from .conftest import free_port, grpc_client, http_client, service_config
from tests.shallow import engine_on_shallow_calibration  # noqa: F401 (engine: a flow, on the shallow calibration)


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


# -- raw bytes, for every HTTP route (the JSON mirror, the sidecar's compressible routes and its
#    mirror under /ilre): broken UTF-8, lone surrogates, deep nesting, huge numbers --------------
def nested(depth: int, key: str = "context") -> bytes:
    return ('{"%s": ' % key + "[" * depth + "1" + "]" * depth + ', "query": "q"}').encode()


RAW_CASES = [
    b'{"context": "abc \\ud800 def", "query": "q"}',           # an escaped lone surrogate
    b'{"context": "ok", "query": "\\udfff"}',
    b'{"prompt": "abc \\ud83d", "n_predict": 1}',
    b'{"messages": [{"role": "user", "content": "\\udc00"}]}',
    b'{"context\\ud800": "a", "query": "b"}',                   # ... in a key
    b"[" * 100_000 + b"]" * 100_000,                            # 100,000 arrays deep
    nested(100), nested(5000, "prompt"), nested(900, "messages"),
    b'{"budget": 1' + b"0" * 5000 + b', "context": "a", "query": "b"}',  # beyond the digit limit
    b'{"budget": 1e999, "context": "a", "query": "b"}',
    b'{"prompt": "caf\xc3", "n_predict": 1}',                    # broken UTF-8
    b"\xff\xfe{}", b"", b"null", b"[]", b'"text"', b"{", b'{"a": NaN}',
]
raw_bodies = st.one_of(
    st.sampled_from(RAW_CASES),
    st.binary(max_size=300),
    st.builds(lambda d, k: nested(d, k), st.integers(0, 3000), st.sampled_from(["context", "prompt", "text", "x"])),
    st.builds(lambda s: json.dumps({"context": s, "query": "q", "prompt": s}).encode(),
              st.text(alphabet=st.characters(codec=None, categories=["Cs", "Ll", "Zs"]), max_size=20)),
    st.builds(lambda n, f: ('{"%s": 9%s, "prompt": "x"}' % (f, "9" * n)).encode(), st.integers(0, 6000),
              st.sampled_from(["budget", "n_predict", "layer"])),
    st.builds(lambda raw, at, junk: raw[:at] + junk + raw[at:], st.sampled_from(RAW_CASES[:4]),
              st.integers(0, 40), st.binary(min_size=1, max_size=4)),
)


def check_raw_reply(reply: httpx.Response, allowed: set[int]) -> None:
    """A clear answer: an allowed status, JSON naming the field on 400, never a 500 or a traceback."""
    assert reply.status_code in allowed, (reply.status_code, reply.text[:300])
    assert "Traceback" not in reply.text
    if reply.status_code == 400:
        body = reply.json()
        error = body.get("error")
        field, message = (body["field"], error) if isinstance(error, str) else (error["param"], error["message"])
        assert field and message.startswith(f"{field}:"), body


@pytest.mark.parametrize("raw", RAW_CASES, ids=range(len(RAW_CASES)))
def test_raw_bytes_json_mirror(http, raw):
    reply = http.post("/v1/compress", content=raw, headers={"x-request-timeout": "120"})
    check_raw_reply(reply, {200, 400})
    if raw.startswith(b'{"context": "abc \\ud800'):
        assert reply.status_code == 400 and reply.json()["field"] == "context"
    if raw.startswith(b"[[["):
        assert reply.status_code == 400 and "nested deeper" in reply.json()["error"]
    if raw.startswith(b'{"budget": 1000'):  # the limit in the request's terms, not the interpreter's advice
        assert reply.status_code == 400
        assert reply.json()["error"] == "request: a number of 5001 digits exceeds the limit of 4300 digits"


@pytest.fixture(scope="module")
def sidecar_no_engine(engine):
    """A sidecar whose engine is not running: what passes its checks ends as 502, never 500."""
    sidecar = SidecarConfig(engine_url=f"http://127.0.0.1:{free_port()}", engine_api="llamacpp", forward="ids")
    with ServiceThread(service_config(), engine, sidecar=sidecar, tokenizer=engine.tokenizer) as svc:
        with httpx.Client(base_url=f"http://127.0.0.1:{svc.http_port}", timeout=120) as client:
            yield client


SIDECAR_ROUTES = ["/completion", "/v1/completions", "/v1/chat/completions", "/generate", "/ilre/v1/compress"]


@pytest.mark.parametrize("route", SIDECAR_ROUTES)
def test_raw_bytes_sidecar_routes(sidecar_no_engine, route):
    for raw in RAW_CASES:
        check_raw_reply(sidecar_no_engine.post(route, content=raw), {200, 400, 502})


@FUZZ
@given(raw=raw_bodies, route=st.sampled_from(SIDECAR_ROUTES))
def test_fuzz_raw_bytes_sidecar(sidecar_no_engine, raw, route):
    check_raw_reply(sidecar_no_engine.post(route, content=raw), {200, 400, 502})


@FUZZ
@given(raw=raw_bodies)
def test_fuzz_raw_bytes_json_mirror(http, raw):
    check_raw_reply(http.post("/v1/compress", content=raw, headers={"x-request-timeout": "120"}), {200, 400})


part = st.one_of(st.fixed_dictionaries({"type": st.just("text"), "text": text}),
                 st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.fixed_dictionaries({"url": text})}),
                 json_value)
chat_message = st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["system", "user", "assistant", "tool", "function"]), json_value)},
    optional={"content": st.one_of(text, st.lists(part, max_size=3), st.none(), json_value),
              "tool_call_id": st.text(max_size=8), "name": json_value})
gateway_requests = st.fixed_dictionaries(
    {"messages": st.one_of(st.lists(chat_message, max_size=5), json_value)},
    optional={"model": json_value, "query": st.one_of(text, json_value), "budget": st.one_of(st.integers(-3, 400), json_value),
              "granularity": st.one_of(st.sampled_from(["unit", "token", "line"]), json_value),
              "id": json_value, "context_id": json_value})


@FUZZ
@example(data={"messages": [{"role": "user", "content": "hi", "name": float("nan")}]})
@example(data={"messages": [{"role": "tool", "content": "word " * 400}], "budget": 100})
@given(data=gateway_requests)
def test_fuzz_gateway_compress(http, data):
    reply = http.post("/v1/compress", content=json.dumps(data, allow_nan=True), headers={"x-request-timeout": "120"})
    check_raw_reply(reply, {200, 400})
    if reply.status_code == 200:
        body = reply.json()
        assert len(body["messages"]) == len(data["messages"]) and all(
            a["role"] == b["role"] for a, b in zip(body["messages"], data["messages"]))
        assert body["tokens_saved"] == body["tokens_before"] - body["tokens_after"]
        assert all(len(h) == 24 and int(h, 16) >= 0 for h in body["ccr_hashes"])


@FUZZ
@given(hash_=st.one_of(st.text(max_size=30), st.text("0123456789abcdef", min_size=24, max_size=24)),
       params=st.dictionaries(st.sampled_from(["query", "budget", "x"]), st.text(max_size=12), max_size=3))
def test_fuzz_gateway_retrieve(http, hash_, params):
    from urllib.parse import quote

    reply = http.get(f"/v1/retrieve/{quote(hash_, safe='')}", params=params)
    check_raw_reply(reply, {400, 404})
    if reply.status_code == 404 and reply.headers["content-type"].startswith("application/json"):
        assert reply.json()["field"] == "hash"
