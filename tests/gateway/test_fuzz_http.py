"""Fuzzing the gateway over real HTTP with hypothesis: malformed JSON, wrong types, invalid
UTF-8, huge and deeply nested bodies, odd headers. Whatever comes in, the answer is a
success or an OpenAI-shaped 4xx: never a 5xx, never a dropped connection.

Bounded by work, not by wall time: a fixed number of examples (derandomized, so every run
sends the same requests), no hypothesis deadline and a generous per-request timeout, so a
slow or busy machine never fails a test; only a wrong answer (or a hang) does, and the
failure names the request that got it.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gw_http import CHAT, Reply

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
VALID = {"/v1/chat/completions": CHAT, "/v1/completions": {"model": "fake/m1", "prompt": "Say hello."},
         "/v1/embeddings": {"model": "fake/m1", "input": "hello"}}
# 200 examples a test, ~1000 requests in all: about 5 s on a shared 2-core machine.
FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
# gw_http's 60 s once failed a test on a loaded CI box; a wrong answer takes milliseconds,
# so only a real hang should ever reach this.
TIMEOUT_S = 300
# The suite's pytest-timeout (300 s a test) would cut a hung request off before it names its
# input; here it is only a backstop for a hang that hypothesis then shrinks (up to 300 s more).
pytestmark = pytest.mark.timeout(1800)

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


def described(route: str, raw: bytes, headers: dict[str, str] | None) -> str:
    """The request as a failure message shows it (a huge body cut to its first 300 bytes)."""
    body = repr(raw[:300]) + (f"... ({len(raw)} bytes)" if len(raw) > 300 else "")
    return f"POST {route} headers={headers or {}!r} body={body}"


def send(gw, route: str, raw: bytes, headers: dict[str, str] | None = None) -> Reply:
    """gw_http.post with TIMEOUT_S instead of 60 s; running out of it fails naming the request."""
    request = urllib.request.Request(gw.url + route, data=raw, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return Reply(response.status, {k.lower(): v for k, v in response.headers.items()}, response.read())
    except urllib.error.HTTPError as error:
        return Reply(error.code, {k.lower(): v for k, v in error.headers.items()}, error.read())
    except (TimeoutError, urllib.error.URLError) as error:
        if isinstance(error, TimeoutError) or isinstance(error.reason, TimeoutError):
            raise AssertionError(f"no answer in {TIMEOUT_S} s to {described(route, raw, headers)}") from error
        raise


def healthz(gw) -> int:
    try:
        with urllib.request.urlopen(gw.url + "/healthz", timeout=TIMEOUT_S) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def check(gw, route: str, body, headers: dict[str, str] | None = None) -> Reply:
    """A success or an OpenAI-shaped 4xx, never a 5xx or a dropped connection; a failure
    message names the request (hypothesis adds the drawn example)."""
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    sent = described(route, raw, headers)
    try:
        reply = send(gw, route, raw, headers)
    except OSError as error:
        raise AssertionError(f"connection failed ({error!r}) for {sent}") from error
    where = f"{sent}\n  answered {reply.status}: {reply.body[:500]!r}"
    assert reply.status < 500, where
    if reply.status >= 400:
        try:
            error = orjson.loads(reply.body)["error"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            error = None
        assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"} \
            and isinstance(error["message"], str), where
    elif reply.headers.get("content-type", "").startswith("application/json"):
        try:
            parsed = orjson.loads(reply.body)
        except orjson.JSONDecodeError:
            parsed = None
        assert isinstance(parsed, dict), where
    return reply


@FUZZ
@given(route=st.sampled_from(ROUTES), raw=st.binary(max_size=300))
def test_arbitrary_bytes(gw, route, raw):
    check(gw, route, raw)


@FUZZ
@given(route=st.sampled_from(ROUTES), body=json_values)
def test_arbitrary_json(gw, route, body):
    check(gw, route, dumps(body))


@FUZZ
@given(route=st.sampled_from(ROUTES), data=st.data())
def test_a_valid_request_with_one_field_replaced(gw, route, data):
    body = dict(VALID[route])
    field = data.draw(st.sampled_from([*body, "stream", "n", "temperature", "seed", "max_tokens", "stop", "user"]))
    body[field] = data.draw(json_values)
    check(gw, route, dumps(body))


@FUZZ
@given(route=st.sampled_from(ROUTES), text=st.text(max_size=50), cut=st.integers(0, 200), junk=st.binary(max_size=8))
def test_valid_requests_cut_short_or_with_bad_bytes_inside(gw, route, text, cut, junk):
    raw = orjson.dumps({**VALID[route], "user": text})
    check(gw, route, raw[:cut] + junk + raw[cut:])


@FUZZ
@given(route=st.sampled_from(ROUTES),
       headers=st.dictionaries(st.sampled_from(["Authorization", "Content-Type", "x-detgate-cache-control",
                                                "x-detgate-mode", "x-detgate-vote", "x-detgate-schema", "Accept",
                                                "User-Agent", "Content-Encoding"]),
                               header_text, max_size=4))
def test_odd_headers(gw, route, headers):
    check(gw, route, VALID[route], headers=headers)


@FUZZ
@given(headers=st.dictionaries(st.sampled_from(["Transfer-Encoding", "Expect", "Cookie", "Content-Length"]),
                               header_text, min_size=1, max_size=2))
def test_headers_that_break_http_framing_get_a_4xx_and_leave_the_gateway_healthy(gw, headers):
    # aiohttp's HTTP parser refuses these before any handler runs (a plain-text 400/417,
    # sometimes closing the connection before the body is sent): a 4xx, never a 5xx.
    raw = orjson.dumps(CHAT)
    try:
        reply = send(gw, "/v1/chat/completions", raw, headers)
    except OSError:  # the gateway closed the connection after its 400, while the body was still going out
        reply = None  # (a timeout is an AssertionError from send, not swallowed here)
    assert reply is None or reply.status < 500, (described("/v1/chat/completions", raw, headers), reply)
    assert healthz(gw) == 200, f"unhealthy after {described('/v1/chat/completions', raw, headers)}"


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
    check(gw, "/v1/chat/completions", raw)


@pytest.mark.parametrize("expect", ["\x80", "102-processing"])
def test_an_expect_the_gateway_does_not_answer_is_a_417(gw, expect):
    reply = check(gw, "/v1/chat/completions", CHAT, headers={"Expect": expect})
    assert reply.status == 417, reply
