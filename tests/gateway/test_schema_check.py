import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.apis import SURFACES
from gateway.strategies.schema_check import (
    JSON_OBJECT,
    SchemaError,
    check_content,
    named_schema,
    schema_problem,
    summary,
    validate,
)

CHAT = SURFACES["chat.completions"]


# The chat surface's schema hooks, called as one answer's checks.
def requested_schema(body, named={}, name=None):
    if name is not None:
        return named_schema(named, name)
    found = CHAT.requested_schema(body)
    return found[1] if found else None


def check_tool_calls(calls, tools):
    return CHAT.problems({"choices": [{"message": {"tool_calls": calls}}]}, {"tools": tools}, None)


def check_message(message, body, named={}, name=None):
    return CHAT.problems({"choices": [{"message": message}]}, body, requested_schema(body, named, name))


def feedback_messages(message, errors):
    return CHAT.with_feedback({"messages": []}, {"choices": [{"message": message}]}, errors)["messages"]

ORDER = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "placed": {"type": "string", "format": "date-time"},
        "email": {"type": "string", "format": "email"},
        "items": {"type": "array", "items": {
            "type": "object",
            "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-\\d+$"},
                           "price": {"type": "number", "minimum": 0}},
            "required": ["sku", "price"], "additionalProperties": False}},
        "odd key": {"type": "integer"},
    },
    "required": ["id", "items"],
}
GOOD = {"id": "3f2b8c1e-9a4d-4c2b-8f1e-2b3c4d5e6f70", "placed": "2026-11-22T16:17:30Z",
        "email": "a@example.com", "items": [{"sku": "ABC-1", "price": 2.5}], "odd key": 3}


def test_a_valid_answer_has_no_errors():
    assert check_content(orjson.dumps(GOOD).decode(), ORDER) == []


def test_errors_name_the_instance_path_the_schema_path_and_the_problem():
    bad = {**GOOD, "items": [{"sku": "ABC-1", "price": 1}, {"sku": "abc", "price": -1, "x": 0}], "odd key": "3"}
    errors = check_content(orjson.dumps(bad).decode(), ORDER)
    assert [(e.path, e.schema_path) for e in errors] == [
        ("$.items[1]", "#/properties/items/items/additionalProperties"),
        ("$.items[1].price", "#/properties/items/items/properties/price/minimum"),
        ("$.items[1].sku", "#/properties/items/items/properties/sku/pattern"),
        ('$["odd key"]', "#/properties/odd key/type"),
    ]
    assert "-1 is less than the minimum of 0" in errors[1].message


@pytest.mark.parametrize("field, value", [("id", "not-a-uuid"), ("placed", "yesterday"), ("email", "nobody")])
def test_formats_are_checked(field, value):
    errors = check_content(orjson.dumps({**GOOD, field: value}).decode(), ORDER)
    assert [(e.path, e.schema_path) for e in errors] == [(f"$.{field}", f"#/properties/{field}/format")]


def test_missing_required_and_wrong_root():
    assert [e.schema_path for e in check_content('{"items": []}', ORDER)] == ["#/required"]
    assert [(e.path, e.schema_path) for e in check_content("[1]", JSON_OBJECT)] == [("$", "#/type")]


@pytest.mark.parametrize("content", ["not json", '{"a": 1', "", None, 5])
def test_content_that_is_not_json_is_one_error_at_the_root(content):
    [error] = check_content(content, JSON_OBJECT)
    assert error.path == "$" and error.schema_path == ""


def test_pointer_escapes_in_schema_paths():
    schema = {"properties": {"a/b": {"properties": {"c~d": {"type": "string"}}}}}
    [error] = validate({"a/b": {"c~d": 1}}, schema)
    assert error.schema_path == "#/properties/a~1b/properties/c~0d/type"
    assert error.path == '$["a/b"]["c~d"]'


def test_which_schema_a_request_asks_for():
    js = {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER}}
    assert requested_schema({"response_format": js}) == ORDER
    assert requested_schema({"response_format": {"type": "json_object"}}) == JSON_OBJECT
    assert requested_schema({"response_format": {"type": "text"}}) is None
    assert requested_schema({}) is None
    assert requested_schema({"response_format": js}, {"mine": JSON_OBJECT}, "mine") == JSON_OBJECT
    with pytest.raises(KeyError, match="mine"):
        requested_schema({}, {"mine": JSON_OBJECT}, "other")


def test_invalid_schemas_are_found_before_any_call():
    assert schema_problem(ORDER) is None
    problem = schema_problem({"properties": {"a": {"type": "strnig"}}})
    assert problem.startswith("#/properties/a/type")
    assert schema_problem({"minimum": "zero"}).startswith("#/minimum")


TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "maximum": 7}},
    "required": ["city"]}}},
    {"type": "function", "function": {"name": "noop"}}]


def call(name, arguments, id_="call_1"):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_tool_arguments_are_checked_against_their_tool():
    assert check_tool_calls([call("weather", '{"city": "Oslo", "days": 3}'), call("noop", "{}")], TOOLS) == []
    errors = check_tool_calls([call("weather", '{"city": "Oslo"}'), call("weather", '{"days": 9}')], TOOLS)
    assert [(e.path, e.schema_path) for e in errors] == [
        ("tool_calls[1].function.arguments", "#/required"),
        ("tool_calls[1].function.arguments.days", "#/properties/days/maximum"),
    ]


def test_unknown_tools_and_broken_arguments_are_errors():
    errors = check_tool_calls([call("launch", "{}"), call("weather", "{oops")], TOOLS)
    assert errors[0].path == "tool_calls[0].function.name" and "launch" in errors[0].message
    assert errors[1].path == "tool_calls[1].function.arguments" and "not valid JSON" in errors[1].message


def test_check_message_covers_content_and_tool_calls():
    body = {"response_format": {"type": "json_object"}, "tools": TOOLS}
    assert check_message({"role": "assistant", "content": '{"ok": true}'}, body) == []
    assert check_message({"role": "assistant", "content": "sure!"}, body)[0].message.startswith("not valid JSON")
    tool_turn = {"role": "assistant", "content": None, "tool_calls": [call("weather", "{}")]}
    assert [e.schema_path for e in check_message(tool_turn, body)] == ["#/required"]
    assert check_message({"role": "assistant", "content": "free text"}, {}) == []


def test_feedback_for_content_quotes_the_answer_and_lists_every_error():
    message = {"role": "assistant", "content": '{"items": 1}', "refusal": None}
    errors = check_content(message["content"], ORDER)
    assistant, user = feedback_messages(message, errors)
    assert assistant == message
    assert user["role"] == "user"
    for e in errors:
        assert f"- {e}" in user["content"]
    assert "#/required" in user["content"] and "$.items" in user["content"]


def test_feedback_for_tool_calls_answers_every_call_with_its_own_errors():
    message = {"role": "assistant", "content": None,
               "tool_calls": [call("weather", '{"days": 9}', "a"), call("noop", "{}", "b")]}
    errors = check_tool_calls(message["tool_calls"], TOOLS)
    assistant, first, second = feedback_messages(message, errors)
    assert assistant["tool_calls"] == message["tool_calls"]
    assert first["role"] == second["role"] == "tool"
    assert first["tool_call_id"] == "a" and "#/properties/days/maximum" in first["content"]
    assert second["tool_call_id"] == "b" and "#/" not in second["content"]


def test_summary_is_one_line_and_bounded():
    errors = [SchemaError(f"$[{i}]", "#/items/type", "1 is not of type 'string'") for i in range(8)]
    line = summary(errors)
    assert "\n" not in line and "$[0]: 1 is not of type 'string' (schema #/items/type)" in line
    assert line.endswith("and 3 more")


@settings(max_examples=100, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                    max_leaves=10))
def test_validation_is_deterministic_and_only_fails_through_schema_errors(value):
    text = orjson.dumps(value).decode()
    errors = check_content(text, ORDER)
    assert errors == check_content(text, ORDER)
    assert all(e.path.startswith("$") and e.schema_path.startswith("#") for e in errors)
    assert (errors == []) == (isinstance(value, dict) and validate(value, ORDER) == [])


def test_malformed_tool_calls_from_the_upstream_are_errors_not_crashes():
    errors = check_tool_calls([None, {"id": "x"}, {"function": "f"}], TOOLS + ["junk"])
    assert [e.path for e in errors] == ["tool_calls[0]", "tool_calls[1]", "tool_calls[2]"]
    [error] = check_message({"role": "assistant", "tool_calls": "weather()"}, {"tools": TOOLS})
    assert error.path == "tool_calls"
    assert feedback_messages({"role": "assistant", "tool_calls": [None]}, errors)[1]["tool_call_id"] == ""
