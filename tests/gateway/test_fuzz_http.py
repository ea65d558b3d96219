"""Fuzzing the gateway over real HTTP with hypothesis: malformed JSON, wrong types, invalid
UTF-8, huge and deeply nested bodies, odd headers. Whatever comes in, the answer is a
success or an OpenAI-shaped 4xx: never a 5xx, never a dropped connection.

Example counts are bounded (derandomized, so a run is repeatable and its time fixed).
"""
from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gw_http import CHAT, get, post

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
VALID = {"/v1/chat/completions": CHAT, "/v1/completions": {"model": "fake/m1", "prompt": "Say hello."},
         "/v1/embeddings": {"model": "fake/m1", "input": "hello"}}
FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12)
header_text = st.text(st.characters(min_codepoint=32, max_codepoint=255, exclude_characters="\x7f"), max_size=60)


@pytest.fixture
def gw(upstream, gateway):
    # One attempt and no breaker: a fuzz request that upstream refuses must come back as it is.
    return gateway(upstream_max_attempts=1, breaker_failures=0, max_body_bytes=256 * 1024)


def dumps(value) -> bytes:
    # The standard library writes what orjson refuses (integers past 64 bits, Infinity).
    return json.dumps(value).encode()


def assert_well_formed(reply) -> None:
    assert reply.status < 500, (reply.status, reply.body[:500])
    if reply.status >= 400:
        error = orjson.loads(reply.body)["error"]
        assert set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str)
    elif reply.headers.get("content-type", "").startswith("application/json"):
        assert isinstance(orjson.loads(reply.body), dict)


@FUZZ
@given(route=st.sampled_from(ROUTES), raw=st.binary(max_size=300))
def test_arbitrary_bytes(gw, route, raw):
    assert_well_formed(post(gw.url, route, raw))


@FUZZ
@given(route=st.sampled_from(ROUTES), body=json_values)
def test_arbitrary_json(gw, route, body):
    assert_well_formed(post(gw.url, route, dumps(body)))


@FUZZ
@given(route=st.sampled_from(ROUTES), data=st.data())
def test_a_valid_request_with_one_field_replaced(gw, route, data):
    body = dict(VALID[route])
    field = data.draw(st.sampled_from([*body, "stream", "n", "temperature", "seed", "max_tokens", "stop", "user"]))
    body[field] = data.draw(json_values)
    assert_well_formed(post(gw.url, route, dumps(body)))


@FUZZ
@given(route=st.sampled_from(ROUTES), text=st.text(max_size=50), cut=st.integers(0, 200), junk=st.binary(max_size=8))
def test_valid_requests_cut_short_or_with_bad_bytes_inside(gw, route, text, cut, junk):
    raw = orjson.dumps({**VALID[route], "user": text})
    assert_well_formed(post(gw.url, route, raw[:cut] + junk + raw[cut:]))


@FUZZ
@given(route=st.sampled_from(ROUTES),
       headers=st.dictionaries(st.sampled_from(["Authorization", "Content-Type", "x-detgate-cache-control",
                                                "x-detgate-mode", "x-detgate-vote", "x-detgate-schema", "Accept",
                                                "User-Agent", "Content-Encoding"]),
                               header_text, max_size=4))
def test_odd_headers(gw, route, headers):
    assert_well_formed(post(gw.url, route, VALID[route], headers=headers))


@FUZZ
@given(headers=st.dictionaries(st.sampled_from(["Transfer-Encoding", "Expect", "Cookie", "Content-Length"]),
                               header_text, min_size=1, max_size=2))
def test_headers_that_break_http_framing_get_a_4xx_and_leave_the_gateway_healthy(gw, headers):
    # aiohttp's HTTP parser refuses these before any handler runs (a plain-text 400/417,
    # sometimes closing the connection before the body is sent): a 4xx, never a 5xx.
    try:
        reply = post(gw.url, "/v1/chat/completions", CHAT, headers=headers)
    except OSError:  # the gateway closed the connection after its 400, while the body was still going out
        reply = None
    assert reply is None or reply.status < 500
    assert get(gw.url, "/healthz").status == 200


@pytest.mark.parametrize("raw", [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"model": "fake/m1", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    b'{"model": "fake/m1", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
    b'{"model": "fake/m1", "messages": [{"role": "user", "content": "' + b"x" * 300_000 + b'"}]}',
    orjson.dumps({**CHAT, "messages": [{"role": "user", "content": "x"}] * 20_000}),
    b'\xef\xbb\xbf' + orjson.dumps(CHAT),
    b"",
    orjson.dumps({**CHAT, "model": "\x1f\x7f-echoed-into-a-header"}),  # the upstream names it in its answer
])
def test_extreme_bodies(gw, raw):
    assert_well_formed(post(gw.url, "/v1/chat/completions", raw))


@pytest.mark.parametrize("expect", ["\x80", "102-processing"])
def test_an_expect_the_gateway_does_not_answer_is_a_417(gw, expect):
    reply = post(gw.url, "/v1/chat/completions", CHAT, headers={"Expect": expect})
    assert reply.status == 417
    assert_well_formed(reply)
