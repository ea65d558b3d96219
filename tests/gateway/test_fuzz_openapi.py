"""schemathesis against the gateway's own OpenAPI description (gateway/openapi.yaml), over
real HTTP: valid and schema-violating requests for every operation. No 5xx, every refusal
is an OpenAI-shaped error, and each documented answer matches the description.

Bounded by work, not by wall time: a fixed number of examples per operation, no hypothesis
deadline and a generous per-request timeout (schemathesis's default is 10 s). A failure
prints the check that failed, the answer and a curl command that repeats the request."""
from __future__ import annotations

import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from gw_http import REPO

schema = schemathesis.openapi.from_path(REPO / "gateway" / "openapi.yaml")
# A wrong answer takes milliseconds; only a real hang should ever reach this.
TIMEOUT_S = 300
# The suite's pytest-timeout (300 s a test) would cut a hung request off before schemathesis
# names it; here it is only a backstop for a hang that hypothesis then shrinks.
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture
def gw(upstream, claude, gateway):
    # One attempt and no breaker: what the fake upstream refuses comes back as it is.
    return gateway(upstream_max_attempts=1, breaker_failures=0,
                   upstreams=[f"fake={upstream[1]}", f"claude={claude[1]}#anthropic"])


def openai_shaped_refusal(ctx, response, case) -> None:
    """A 4xx the gateway itself gives carries {"error": {message, type, param, code}}.

    Methods the description does not list go to the plain /v1 proxy and come back as the
    upstream answered them; those are the upstream's own errors, passed on unchanged."""
    if response.request.method != case.operation.method.upper() or case.path == "/v1/messages":
        return  # /v1/messages answers in Anthropic's shape, which its described responses check
    if 400 <= response.status_code < 500:
        try:
            error = orjson.loads(response.content)["error"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            error = None  # reported below, with the body, as a failed check rather than a crash
        assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}, \
            f"not an OpenAI-shaped error: {response.content[:500]!r}"


@schema.parametrize()
# 40 examples for each of the 5 operations: about 5 s on a shared 2-core machine.
@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much])
def test_the_gateway_keeps_its_openapi_description(case, gw):
    case.call_and_validate(base_url=gw.url, timeout=TIMEOUT_S,
                           checks=[not_a_server_error, status_code_conformance,
                                   response_schema_conformance, openai_shaped_refusal])
