import copy
import unicodedata

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.apis import SURFACES
from gateway.policy.canonical import (
    RULES,
    UNKEYED_FIELDS,
    CanonicalError,
    OrderedObject,
    canonical_json,
)

ROUTES = tuple(SURFACES)


def canonicalize(route, body):
    return SURFACES[route].canonical(body, True)

INVISIBLE = ("\ufeff", "\u200b", "\u2060")
FAMILY_ZWJ = "\U0001F468\u200d\U0001F469\u200d\U0001F467"
FAMILY_PLAIN = "\U0001F468\U0001F469\U0001F467"


def chat(*contents, **params):
    return {"model": "m", "messages": [{"role": "user", "content": c} for c in contents], **params}


def cj(route, body):
    return canonical_json(canonicalize(route, body).key)


# ---------------------------------------------------------------- text rules

@pytest.mark.parametrize("dirty, clean, rule", [
    ("\ufeffhello", "hello", "bom"),
    ("hel\u200blo", "hello", "zero_width"),
    ("hel\u2060lo", "hello", "word_joiner"),
    ("a\r\nb\rc\n", "a\nb\nc\n", "crlf"),
    ("cafe\u0301", "caf\u00e9", "nfc"),
])
def test_text_rule_cleans_and_is_named(dirty, clean, rule):
    out = canonicalize("chat.completions", chat(dirty))
    assert out.key["messages"][0]["content"] == clean
    assert out.rules == (rule,)


def test_removal_happens_before_nfc_so_a_hidden_char_cannot_block_composition():
    out = canonicalize("chat.completions", chat("e\u200b\u0301"))
    assert out.key["messages"][0]["content"] == "\u00e9"
    assert out.rules == ("zero_width", "nfc")


def test_nfc_not_nfkc():
    out = canonicalize("chat.completions", chat("x\u00b2 \ufb01"))
    assert out.key["messages"][0]["content"] == "x\u00b2 \ufb01"


def test_zwj_and_zwnj_are_kept_so_the_family_emoji_differs_from_three_people():
    assert cj("chat.completions", chat(FAMILY_ZWJ)) != cj("chat.completions", chat(FAMILY_PLAIN))
    persian = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"  # ZWNJ is spelling here
    out = canonicalize("chat.completions", chat(persian))
    assert out.key["messages"][0]["content"] == persian and out.rules == ()


@pytest.mark.parametrize("char", ["\u200e", "\u202e", "\ufe0f", "\u00ad", "\u2062"])
def test_other_invisible_format_characters_are_kept(char):
    assert cj("chat.completions", chat(f"a{char}b")) != cj("chat.completions", chat("ab"))


def test_each_firing_is_counted_once_per_place():
    out = canonicalize("chat.completions", chat("\ufeffa\ufeff", "b\ufeff", "c"))
    assert out.rules.count("bom") == 2


def test_text_rules_reach_names_parts_descriptions_prompts_and_inputs():
    body = chat(
        [{"type": "text", "text": "a\r\n"}, {"type": "image_url", "image_url": {"url": "u"}}],
        tools=[{"type": "function", "function": {"name": "f", "description": "d\ufeff"}}],
        functions=[{"name": "g", "description": "e\u200b"}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "s", "description": "cafe\u0301", "schema": {}}},
    )
    body["messages"].append({"role": "assistant", "content": [{"type": "refusal", "refusal": "no\r"}],
                             "name": "bo\u200bb"})
    out = canonicalize("chat.completions", body).key
    assert out["messages"][0]["content"][0]["text"] == "a\n"
    assert out["messages"][1]["content"][0]["refusal"] == "no\n"
    assert out["messages"][1]["name"] == "bob"
    assert out["tools"][0]["function"]["description"] == "d"
    assert out["functions"][0]["description"] == "e"
    assert out["response_format"]["json_schema"]["description"] == "caf\u00e9"
    comp = canonicalize("completions", {"model": "m", "prompt": ["\ufeffp", "q\r\n"],
                                        "suffix": "s\u200b"}).key
    assert comp["prompt"] == ["p", "q\n"] and comp["suffix"] == "s"
    emb = canonicalize("embeddings", {"model": "m", "input": ["x\u2060", "y\r"]}).key
    assert emb["input"] == ["x", "y\n"]


def test_data_urls_audio_tool_arguments_stop_sequences_and_unknown_fields_are_verbatim():
    raw = "data:image/png;base64,\ufeffAAAA\r\n"
    body = chat(
        [{"type": "image_url", "image_url": {"url": raw}},
         {"type": "input_audio", "input_audio": {"data": "\u200bQUJD", "format": "wav"}}],
        stop=["\r\n", "x"],
        vendor_note="a\r\nb",
    )
    body["messages"].append({"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a":\r\n"\ufeff"}'}}]})
    out = canonicalize("chat.completions", body)
    assert out.rules == ()
    assert out.key == body


def test_json_schemas_are_verbatim_and_keep_their_key_order():
    schema = {"type": "object", "properties": {
        "reasoning": {"type": "string", "pattern": "^a\r\nb$"}, "answer": {"enum": ["cafe\u0301"]}}}
    flipped = {"type": "object", "properties": {
        "answer": schema["properties"]["answer"], "reasoning": schema["properties"]["reasoning"]}}

    def with_schema(s):
        return chat("q", response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": s}},
                    tools=[{"type": "function", "function": {"name": "f", "parameters": s}}])

    out = canonicalize("chat.completions", with_schema(schema))
    sent = out.key["response_format"]["json_schema"]["schema"]
    assert isinstance(sent, OrderedObject) and sent == schema
    assert list(sent["properties"]) == ["reasoning", "answer"]
    assert out.key["tools"][0]["function"]["parameters"] == schema
    assert out.rules == ()
    assert cj("chat.completions", with_schema(schema)) != cj("chat.completions", with_schema(flipped))
    # Outside schemas, order never matters.
    assert b'"properties":{"reasoning"' in cj("chat.completions", with_schema(schema))


def test_numbers_inside_schemas_still_take_one_form():
    a = chat("q", tools=[{"type": "function", "function": {"name": "f", "parameters": {"maximum": 1}}}])
    b = chat("q", tools=[{"type": "function", "function": {"name": "f", "parameters": {"maximum": 1.0}}}])
    assert cj("chat.completions", a) == cj("chat.completions", b)


# ---------------------------------------------------------------- shape rules

def test_single_text_part_is_a_string():
    out = canonicalize("chat.completions", chat([{"type": "text", "text": "hi"}]))
    assert out.key["messages"][0]["content"] == "hi" and out.rules == ("content_shape",)


@pytest.mark.parametrize("content", [
    [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
    [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}],
    [{"type": "image_url", "image_url": {"url": "u"}}],
    [],
])
def test_other_part_lists_keep_their_shape(content):
    out = canonicalize("chat.completions", chat(content))
    assert isinstance(out.key["messages"][0]["content"], list)
    assert "content_shape" not in out.rules


@pytest.mark.parametrize("route, field, one, listed", [
    ("embeddings", "input", "x", ["x"]),
    ("embeddings", "input", [1, 2], [[1, 2]]),
    ("completions", "prompt", "x", ["x"]),
    ("completions", "prompt", [3], [[3]]),
])
def test_a_list_of_one_input_is_that_input(route, field, one, listed):
    a = canonicalize(route, {"model": "m", field: one})
    b = canonicalize(route, {"model": "m", field: listed})
    assert a.key == b.key and b.rules == ("input_shape",)


def test_several_inputs_and_empty_token_lists_are_left_alone():
    assert canonicalize("embeddings", {"model": "m", "input": ["a", "b"]}).key["input"] == ["a", "b"]
    assert canonicalize("embeddings", {"model": "m", "input": [[]]}).key["input"] == [[]]
    assert canonicalize("embeddings", {"model": "m", "input": [[1], [2]]}).key["input"] == [[1], [2]]


@pytest.mark.parametrize("stop", ["x", ["x"], ["x", "x"]])
def test_stop_sequences_form_a_set(stop):
    assert canonicalize("completions", {"model": "m", "stop": stop}).key["stop"] == "x"


def test_stop_order_does_not_matter_but_content_does():
    a = canonicalize("chat.completions", chat("q", stop=["b", "a"]))
    b = canonicalize("chat.completions", chat("q", stop=["a", "b"]))
    assert a.key == b.key and a.key["stop"] == ["a", "b"]
    assert a.rules == ("stop_shape",) and b.rules == ()
    assert cj("chat.completions", chat("q", stop=["a"])) != cj("chat.completions", chat("q", stop=["a", "b"]))


def test_null_optional_fields_are_absent_but_unknown_nulls_are_kept():
    out = canonicalize("chat.completions", chat("q", temperature=None, seed=None, vendor=None))
    assert out.key == {"model": "m", "messages": [{"role": "user", "content": "q"}], "vendor": None}
    assert out.rules == ("null_field", "null_field")


def test_null_message_and_function_fields_are_absent():
    body = {"model": "m", "messages": [
        {"role": "assistant", "content": None, "name": None,
         "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
        "tools": [{"type": "function", "function": {"name": "f", "description": None, "strict": None}}]}
    out = canonicalize("chat.completions", body)
    assert "content" not in out.key["messages"][0] and "name" not in out.key["messages"][0]
    assert out.key["tools"][0]["function"] == {"name": "f"}
    assert out.rules.count("null_field") == 4


def test_dropped_fields_cannot_reach_the_key():
    noisy = chat("q", user="u1", stream=True, stream_options={"include_usage": True},
                 metadata={"a": "b"}, store=True, service_tier="flex", prompt_cache_key="k",
                 safety_identifier="s")
    out = canonicalize("chat.completions", noisy)
    assert out.key == chat("q")
    assert out.rules == ("dropped_field",) * len(UNKEYED_FIELDS)


def test_max_tokens_and_max_completion_tokens_stay_distinct():
    assert cj("chat.completions", chat("q", max_tokens=5)) != cj("chat.completions",
                                                                  chat("q", max_completion_tokens=5))


def test_integral_floats_are_ints_everywhere():
    out = canonicalize("chat.completions", chat("q", temperature=1.0, top_p=0.5, vendor={"x": [2.0]}))
    assert out.key["temperature"] == 1 and type(out.key["temperature"]) is int
    assert type(out.key["vendor"]["x"][0]) is int and out.key["top_p"] == 0.5
    assert out.rules == ("number_form", "number_form")
    assert canonical_json({"a": -0.0, "b": 1e16, "c": 2.0**63}) == b'{"a":0,"b":10000000000000000,"c":9223372036854775808}'


def test_bools_are_not_numbers():
    assert canonical_json([True, 1, 1.0]) == b"[true,1,1]"


# ---------------------------------------------------------------- serialization and errors

def test_canonical_json_sorts_keys_compactly():
    assert canonical_json({"b": 1, "a": {"d": [1.5, None], "c": "é"}}) == '{"a":{"c":"é","d":[1.5,null]},"b":1}'.encode()


@pytest.mark.parametrize("value, param", [
    ({"a": [1, float("nan")]}, "a[1]"),
    ({"a": {"b": float("inf")}}, "a.b"),
    ({"x": 2**64}, "x"),
    ({"x": -(2**63) - 1}, "x"),
    ({"x": object()}, "x"),
])
def test_values_json_cannot_carry_are_errors_with_a_path(value, param):
    with pytest.raises(CanonicalError) as err:
        canonical_json(value)
    assert err.value.param == param


def test_canonicalize_reports_the_param_of_a_bad_number():
    with pytest.raises(CanonicalError) as err:
        canonicalize("chat.completions", chat("q", logit_bias={"5": float("nan")}))
    assert err.value.param == "logit_bias.5"


def test_lone_surrogates_are_an_error_not_a_crash():
    with pytest.raises(CanonicalError):
        canonical_json({"a": "\ud800"})


def test_non_object_body():
    with pytest.raises(CanonicalError):
        canonicalize("chat.completions", ["not", "an", "object"])


# ---------------------------------------------------------------- properties

json_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | \
    st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)
text = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
part = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, text),
    st.builds(lambda u: {"type": "image_url", "image_url": {"url": u}}, text),
)
content = st.one_of(text, st.lists(part, max_size=3), st.none())
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": content},
    optional={"name": text | st.none(), "x_vendor": json_values},
)
chat_body = st.fixed_dictionaries(
    {"model": st.sampled_from(["m", "n"]), "messages": st.lists(message, min_size=1, max_size=4)},
    optional={
        "temperature": st.none() | st.floats(0, 2) | st.integers(0, 2),
        "seed": st.none() | st.integers(0, 2**31),
        "stop": st.none() | text | st.lists(text, max_size=3),
        "user": text,
        "stream": st.booleans(),
        "tools": st.lists(st.fixed_dictionaries({
            "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": st.just("f")}, optional={
                "description": text | st.none(),
                "parameters": st.dictionaries(st.text(max_size=5), json_values, max_size=3)}),
        }), max_size=2),
        "extra": json_values,
    },
)
inputs = st.one_of(text, st.lists(text, max_size=3), st.lists(st.integers(0, 9), max_size=3),
                   st.lists(st.lists(st.integers(0, 9), max_size=3), max_size=2))
routed_body = st.one_of(
    st.tuples(st.just("chat.completions"), chat_body),
    st.tuples(st.just("completions"), st.fixed_dictionaries(
        {"model": st.just("m"), "prompt": inputs},
        optional={"suffix": text | st.none(), "stop": text | st.lists(text, max_size=3), "n": st.integers(1, 3)})),
    st.tuples(st.just("embeddings"), st.fixed_dictionaries(
        {"model": st.just("m"), "input": inputs}, optional={"dimensions": st.none() | st.integers(1, 8)})),
    st.tuples(st.sampled_from(ROUTES), st.dictionaries(st.text(max_size=6), json_values, max_size=5)),
)
PROPS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(routed_body)
def test_canonicalize_is_idempotent_and_never_mutates_its_input(route_body):
    route, body = route_body
    before = copy.deepcopy(body)
    once = canonicalize(route, body)
    assert body == before
    twice = canonicalize(route, once.key)
    assert twice.key == once.key and twice.rules == ()
    assert canonical_json(twice.key) == canonical_json(once.key)
    assert orjson.loads(canonical_json(once.key)) == once.key


SCHEMA_FIELDS = ("parameters", "schema")


def _shuffled(value, rng):
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: v if k in SCHEMA_FIELDS else _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


@PROPS
@given(routed_body, st.randoms(use_true_random=False))
def test_key_order_outside_schemas_never_matters(route_body, rng):
    route, body = route_body
    assert cj(route, _shuffled(body, rng)) == cj(route, body)


def _dirty(s, rng):
    out = []
    for ch in s:
        if rng.random() < 0.3:
            out.append(rng.choice(INVISIBLE))
        out.append(rng.choice(["\r\n", "\r"]) if ch == "\n" else ch)
    return "".join(out) + rng.choice(["", *INVISIBLE])


@PROPS
@given(st.lists(text.filter(lambda s: "\r" not in s), min_size=1, max_size=3), st.randoms(use_true_random=False))
def test_invisible_chars_and_line_endings_never_matter(contents, rng):
    assert cj("chat.completions", chat(*[_dirty(c, rng) for c in contents])) == cj("chat.completions", chat(*contents))
    assert cj("embeddings", {"model": "m", "input": [_dirty(c, rng) for c in contents]}) == \
        cj("embeddings", {"model": "m", "input": contents})


@PROPS
@given(text)
def test_clean_text_is_nfc_without_removed_chars_and_keeps_joiners(s):
    out = canonicalize("completions", {"model": "m", "prompt": s}).key["prompt"]
    assert unicodedata.is_normalized("NFC", out)
    assert not any(c in out for c in (*INVISIBLE, "\r"))
    assert out.count("\u200d") == s.count("\u200d") and out.count("\u200c") == s.count("\u200c")


@PROPS
@given(text, st.integers(0, 5))
def test_equivalent_shapes_and_forms_give_one_key(s, n):
    plain = chat(s, temperature=n, seed=n)
    assert cj("chat.completions", chat([{"type": "text", "text": s}], temperature=float(n), seed=n,
                                       top_p=None, user="who")) == cj("chat.completions", plain)


@PROPS
@given(chat_body, st.data())
def test_a_meaningful_change_changes_the_key(body, data):
    i = data.draw(st.integers(0, len(body["messages"]) - 1))
    change = data.draw(st.sampled_from(["text", "parts", "role", "param", "unknown", "zwj", "insert"]))
    changed = copy.deepcopy(body)
    message = changed["messages"][i]
    if change == "text":
        word = data.draw(text.filter(lambda s: s.strip("\ufeff\u200b\u2060\r")))
        message["content"] = f"{word}!"
        body["messages"][i]["content"] = word
    elif change == "parts":
        message["content"] = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
        body["messages"][i]["content"] = "ab"
    elif change == "role":
        message["role"] += "x"
    elif change == "param":
        changed["temperature"] = (changed.get("temperature") or 0) + 0.5
    elif change == "unknown":
        changed["unknown_knob"] = data.draw(json_values)
    elif change == "zwj":
        message["content"] = FAMILY_ZWJ
        body["messages"][i]["content"] = FAMILY_PLAIN
    else:
        changed["messages"].insert(i, {"role": "system", "content": "first"})
    assert cj("chat.completions", changed) != cj("chat.completions", body)


@PROPS
@given(routed_body)
def test_rules_name_only_known_rules(route_body):
    assert set(canonicalize(*route_body).rules) <= set(RULES)


def test_rules_lists_exactly_the_rules_that_can_fire():
    dirty = chat("\ufeffa\u200b\u2060\r\ne\u0301", [{"type": "text", "text": "t"}],
                 stop=["b", "a"], seed=None, temperature=1.0, user="u")
    fired = set(canonicalize("chat.completions", dirty).rules)
    fired |= set(canonicalize("embeddings", {"model": "m", "input": ["x"]}).rules)
    assert fired == set(RULES)
