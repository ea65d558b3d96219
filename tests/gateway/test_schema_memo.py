"""Each distinct schema is checked and compiled once per process, and a bad one stays the
client's 400 on every request (counted on the memo, not timed)."""
from __future__ import annotations

import copy
import uuid

from fakes.noisy_upstream import NoisyUpstream
from gateway.strategies.schema_memo import SCHEMAS, SchemaMemo
from gw_http import post
from noisy_gw import ANSWER_SCHEMA, QUESTION, noisy_gateway

BAD = {"type": "object", "properties": {"city": {"type": "strnig"}}}


def test_an_equal_schema_is_checked_and_compiled_once():
    memo = SchemaMemo()
    assert memo.error(ANSWER_SCHEMA) is None and memo.error(copy.deepcopy(ANSWER_SCHEMA)) is None
    first, again = memo.validator(copy.deepcopy(ANSWER_SCHEMA)), memo.validator(ANSWER_SCHEMA)
    assert first is again and (memo.checks, memo.compiles) == (1, 1)
    assert not first.is_valid({"answer": "maybe"}) and first.is_valid({"answer": "yes"})


def test_a_bad_schema_is_checked_once_and_refused_every_time():
    memo = SchemaMemo()
    errors = [memo.error(copy.deepcopy(BAD)) for _ in range(3)]
    assert all(e is not None and e.message == errors[0].message for e in errors)
    assert list(errors[0].absolute_path) == ["properties", "city", "type"] and memo.checks == 1


def test_the_memo_keeps_its_own_copy_of_a_schema():
    memo = SchemaMemo()
    schema = copy.deepcopy(ANSWER_SCHEMA)
    validator = memo.validator(schema)
    schema["properties"]["answer"]["enum"].append("maybe")  # the request's dict, changed after
    assert not validator.is_valid({"answer": "maybe"})
    assert memo.validator(schema) is not validator and memo.compiles == 2


def test_a_nan_is_never_mistaken_for_null():
    # orjson writes NaN as null; a TOML config can hold a NaN, so such a schema is not keyed.
    memo = SchemaMemo()
    null, nan = {"const": None}, {"const": float("nan")}
    assert memo.validator(null).is_valid(None) and not memo.validator(nan).is_valid(None)
    assert memo.validator(null).is_valid(None) and (memo.checks, memo.compiles) == (2, 2)


def test_least_recently_used_schemas_are_dropped_by_count_and_by_bytes():
    memo = SchemaMemo(entries=2)
    a, b, c = ({"type": t} for t in ("string", "number", "object"))
    for schema in (a, b, a, c, a, b):  # c drops b, the least recent; b comes back once
        memo.error(schema)
    assert memo.checks == 4
    small = SchemaMemo(budget=40)
    for schema in (a, b, a):  # 17 + 17 bytes fit; a third would not
        small.error(schema)
    assert small.checks == 2
    small.error(c)
    small.error(a)
    assert small.checks == 3 and len(small._memo) == 2


def test_a_gateway_checks_a_repeated_tool_schema_once_and_refuses_a_bad_one_every_time():
    # A schema no other test sends, so the process-wide memo has not seen it.
    schema = {"type": "object", "properties": {"city": {"type": "string", "description": str(uuid.uuid4())}},
              "required": ["city"]}
    tools = [{"type": "function", "function": {"name": "weather", "parameters": schema}}]
    answer = {**ANSWER_SCHEMA, "$comment": str(uuid.uuid4())}
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": answer}}
    fake = NoisyUpstream(by_seed={0: "yes"})
    with noisy_gateway(fake) as gw:
        checks, compiles = SCHEMAS.checks, SCHEMAS.compiles
        for n in range(3):  # three different questions: each prepared, none answered from the request memo
            messages = [{"role": "user", "content": f"{QUESTION[0]['content']} ({n})"}]
            reply = post(gw.url, "/v1/chat/completions", {"model": "m1", "messages": messages, "tools": tools,
                                                          "response_format": fmt})
            assert reply.status == 200, reply.text
        assert SCHEMAS.checks - checks == 2  # the tool's parameters and the response format's schema
        assert SCHEMAS.compiles - compiles == 1  # the answers' content validated under one validator
        bad = [{"type": "function", "function": {"name": "weather", "parameters": BAD}}]
        for extra in ({}, {"response_format": fmt}):  # beside a valid response schema too
            reply = post(gw.url, "/v1/chat/completions", {"model": "m1", "messages": QUESTION, "tools": bad, **extra})
            error = reply.json()["error"]
            assert reply.status == 400 and error["param"] == "tools[0].function.parameters"
            assert error["code"] == "invalid_schema" and "#/properties/city/type" in error["message"]
        assert len(fake.calls) == 3
