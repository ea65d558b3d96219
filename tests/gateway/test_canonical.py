import copy
import re
import unicodedata

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.apis import SURFACES
from gateway.policy.canonical import (
    KEPT_FROM_NFC,
    RULES,
    TEXT_RULES,
    UNKEYED_FIELDS,
    CanonicalError,
    canonical_json,
    text_warning,
    value_json,
)

ROUTES = tuple(SURFACES)


def canonicalize(route, body, text=True):
    return SURFACES[route].canonical(body, text)

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
    ("a\r\nb\r\n", "a\nb\n", "crlf"),
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


def test_a_lone_cr_is_not_a_line_ending():
    progress = "10%\r100%\r\n"
    out = canonicalize("chat.completions", chat(progress))
    assert out.key["messages"][0]["content"] == "10%\r100%\n" and out.rules == ("crlf",)
    assert cj("chat.completions", chat("10%\r100%")) != cj("chat.completions", chat("10%\n100%"))


# Each stands alone yet NFC replaces it: a homoglyph check or a piece of code asks about
# exactly this character.
@pytest.mark.parametrize("kept, nfc", [
    ("\u212a", "K"),  # KELVIN SIGN
    ("\u2126", "\u03a9"),  # OHM SIGN
    ("\u212b", "\u00c5"),  # ANGSTROM SIGN
    ("\u037e", ";"),  # GREEK QUESTION MARK
    ("\u0387", "\u00b7"),  # GREEK ANO TELEIA
    ("\uf900", "\u8c48"),  # a CJK compatibility ideograph
    ("\U0002f800", "\u4e3d"),  # one from the supplement
    ("\u0958", "\u0915\u093c"),  # DEVANAGARI LETTER QA, a composition exclusion
])
def test_characters_nfc_would_replace_stay_as_typed(kept, nfc):
    assert unicodedata.normalize("NFC", kept) == nfc  # what plain NFC would have done
    typed = f"if x == '{kept}': pass"
    out = canonicalize("chat.completions", chat(typed))
    assert out.key["messages"][0]["content"] == typed and out.rules == ()
    assert cj("chat.completions", chat(typed)) != cj("chat.completions", chat(typed.replace(kept, nfc)))


def test_composition_still_runs_around_a_kept_character():
    out = canonicalize("chat.completions", chat("e\u0301\u212ae\u0301"))
    assert out.key["messages"][0]["content"] == "\u00e9\u212a\u00e9" and out.rules == ("nfc",)
    # Nothing composes across it: the Kelvin sign with an acute is not K-acute (U+1E30).
    assert canonicalize("completions", {"model": "m", "prompt": "\u212a\u0301"}).key["prompt"] == "\u212a\u0301"


def test_the_kept_set_is_every_character_nfc_replaces_alone_singletons_included():
    singletons = [chr(cp) for cp in range(0x110000) if not 0xD800 <= cp < 0xE000
                  and (d := unicodedata.decomposition(chr(cp))) and not d.startswith("<") and len(d.split()) == 1]
    assert len(singletons) > 1000 and set(singletons) <= set(KEPT_FROM_NFC)
    assert all(unicodedata.normalize("NFC", ch) != ch for ch in KEPT_FROM_NFC)
    assert "\u00e9" not in KEPT_FROM_NFC and "\u0301" not in KEPT_FROM_NFC  # composable, not replaced


def test_json_only_applies_no_text_rule_but_every_shape_rule():
    dirty = "\ufeffa\u200b\r\ne\u0301"
    body = chat([{"type": "text", "text": dirty}], stop=["x", "x"], n=1)
    out = canonicalize("chat.completions", body, text=False)
    assert out.key["messages"][0]["content"] == dirty
    assert not set(out.rules) & set(TEXT_RULES) and {"content_shape", "stop_shape", "default_value"} <= set(out.rules)
    assert cj("chat.completions", body) != canonical_json(out.key)
    assert text_warning(out.rules) is None
    assert text_warning(canonicalize("chat.completions", body).rules) == (
        "text canonicalized (bom, zero_width, crlf, nfc); x-detgate-canonical: json-only sends it as written")


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
    body["messages"].append({"role": "assistant", "content": [{"type": "refusal", "refusal": "no\r\n"}],
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
    emb = canonicalize("embeddings", {"model": "m", "input": ["x\u2060", "y\r\n"]}).key
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


SCHEMA = {"type": "object", "properties": {
    "reasoning": {"type": "string", "pattern": "^a\r\nb$"},
    "answer": {"enum": ["cafe\u0301", 1.0], "const": 1.0, "default": 2.0, "examples": [0.0]}}}
FLIPPED = {"type": "object", "properties": {"answer": SCHEMA["properties"]["answer"],
                                            "reasoning": SCHEMA["properties"]["reasoning"]}}
INTEGRAL = {"type": "object", "properties": {"reasoning": SCHEMA["properties"]["reasoning"], "answer": {
    "enum": ["cafe\u0301", 1], "const": 1, "default": 2, "examples": [0]}}}

# Every place a provider reads a JSON schema from, as (route, body for a schema, path to it):
# the ones OpenAI defines, Fireworks' and Together's json_object schema, vLLM's guided_json
# and structured_outputs.
SCHEMA_PLACES = {
    "json_schema": ("chat.completions", lambda s: chat("q", response_format={
        "type": "json_schema", "json_schema": {"name": "n", "schema": s}}), ("response_format", "json_schema", "schema")),
    "tool": ("chat.completions", lambda s: chat("q", tools=[{"type": "function", "function": {"name": "f", "parameters": s}}]),
             ("tools", 0, "function", "parameters")),
    "function": ("chat.completions", lambda s: chat("q", functions=[{"name": "f", "parameters": s}]),
                 ("functions", 0, "parameters")),
    "json_object": ("chat.completions", lambda s: chat("q", response_format={"type": "json_object", "schema": s}),
                    ("response_format", "schema")),
    "guided_json": ("chat.completions", lambda s: chat("q", guided_json=s), ("guided_json",)),
    "structured_outputs": ("chat.completions", lambda s: chat("q", structured_outputs={"json": s}),
                           ("structured_outputs", "json")),
    "completions": ("completions", lambda s: {"model": "m", "prompt": "p", "guided_json": s}, ("guided_json",)),
}


def _at(body, path):
    for step in path:
        body = body[step]
    return body


@pytest.mark.parametrize("place", SCHEMA_PLACES)
def test_json_schemas_keep_their_order_numbers_and_text_wherever_they_appear(place):
    route, make, path = SCHEMA_PLACES[place]
    out = canonicalize(route, make(SCHEMA))
    for form in (out.key, out.sent, orjson.loads(canonical_json(out.key))):
        kept = _at(form, path)
        assert kept == SCHEMA and list(kept["properties"]) == ["reasoning", "answer"]
        assert type(kept["properties"]["answer"]["const"]) is float  # 1.0 stays 1.0
    assert out.rules == ()
    assert len({cj(route, make(s)) for s in (SCHEMA, FLIPPED, INTEGRAL)}) == 3  # another order, or 1 for 1.0: another request
    assert b'"const":1.0' in cj(route, make(SCHEMA))


def test_unknown_members_are_kept_exactly_as_sent_at_every_level():
    vendor = {"z": 1.0, "a": [{"y": 2.0, "b": "\ufeff"}]}
    body = chat("q", vendor=vendor, repetition_penalty=1.0)
    body["messages"][0]["reasoning_content"] = {"b": 1, "a": 2}
    body["messages"].append({"role": "user", "content": [
        {"type": "text", "text": "a", "cache_control": {"type": "ephemeral", "ttl": "5m"}},
        {"type": "video_url", "video_url": {"url": "u", "fps": 2.0}}]})
    out = canonicalize("chat.completions", body)
    assert out.rules == ()
    sent = orjson.dumps(out.sent)
    assert b'"vendor":{"z":1.0,"a":[{"y":2.0,"b":"\xef\xbb\xbf"}]}' in sent
    assert b'"repetition_penalty":1.0' in sent and b'"reasoning_content":{"b":1,"a":2}' in sent
    assert b'{"type":"video_url","video_url":{"url":"u","fps":2.0}}' in sent
    assert b'"cache_control":{"type":"ephemeral","ttl":"5m"}' in sent
    flipped = {**body, "vendor": {"a": vendor["a"], "z": 1.0}}
    assert cj("chat.completions", flipped) != cj("chat.completions", body)
    assert cj("chat.completions", {**body, "repetition_penalty": 1}) != cj("chat.completions", body)


@pytest.mark.parametrize("body", [
    chat("q", tools=[{"type": "custom", "custom": {"name": "g", "description": "d\r\n"}}]),
    chat("q", response_format={"type": "grammar", "grammar": "root ::= \"a\"\r\n"}),
    chat([{"type": "input_video", "video": {"b": 1.0, "a": 2}}, {"type": "text", "text": "x\r\n"}]),
])
def test_objects_of_an_unknown_type_are_kept_whole(body):
    out = canonicalize("chat.completions", body)
    kept = body["tools"] if "tools" in body else body.get("response_format") or body["messages"][0]["content"][0]
    assert orjson.dumps(kept) in orjson.dumps(out.sent)
    assert "nfc" not in out.rules and out.rules.count("crlf") == (1 if "tools" not in body and "response_format" not in body else 0)


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
def test_one_stop_sequence_is_a_string(stop):
    assert canonicalize("completions", {"model": "m", "stop": stop}).key["stop"] == "x"


def test_stop_keeps_its_order_and_drops_only_repeats():
    # vLLM stops at the first listed sequence that matches: these two complete differently.
    a = canonicalize("completions", {"model": "m", "prompt": "p", "stop": [".\n", "\n", ".\n"]})
    b = canonicalize("completions", {"model": "m", "prompt": "p", "stop": ["\n", ".\n"]})
    assert a.key["stop"] == [".\n", "\n"] and a.rules == ("stop_shape",)
    assert b.key["stop"] == ["\n", ".\n"] and b.rules == ()
    assert canonical_json(a.key) != canonical_json(b.key)
    assert cj("chat.completions", chat("q", stop=["a"])) != cj("chat.completions", chat("q", stop=["a", "b"]))


@pytest.mark.parametrize("route, body, default", [
    ("chat.completions", chat("q"), {"n": 1}),
    ("chat.completions", chat("q"), {"stop": []}),
    ("chat.completions", chat("q"), {"logprobs": False}),
    ("chat.completions", chat("q"), {"frequency_penalty": 0}),
    ("chat.completions", chat("q"), {"frequency_penalty": 0.0}),
    ("chat.completions", chat("q"), {"presence_penalty": -0.0}),
    ("chat.completions", chat("q"), {"response_format": {"type": "text"}}),
    ("completions", {"model": "m", "prompt": "p"}, {"n": 1, "best_of": 1, "echo": False, "stop": []}),
])
def test_a_provider_default_equals_its_absence(route, body, default):
    out = canonicalize(route, {**body, **default})
    assert out.key == canonicalize(route, body).key
    assert "default_value" in out.rules and not set(default) & set(out.sent)


def test_image_detail_auto_equals_its_absence_and_other_details_do_not():
    def image(**detail):
        return chat([{"type": "text", "text": "what is this"},
                     {"type": "image_url", "image_url": {"url": "https://x/y.png", **detail}}])
    assert cj("chat.completions", image(detail="auto")) == cj("chat.completions", image())
    assert cj("chat.completions", image(detail="high")) != cj("chat.completions", image())


@pytest.mark.parametrize("route, body, close", [
    ("chat.completions", chat("q"), {"n": 2}),
    ("chat.completions", chat("q"), {"logprobs": True}),
    ("chat.completions", chat("q"), {"logprobs": 0}),  # not false: sent as it came, the provider says what it means
    ("chat.completions", chat("q"), {"frequency_penalty": 0.5}),
    ("chat.completions", chat("q"), {"response_format": {"type": "json_object"}}),
    ("chat.completions", chat("q"), {"response_format": {"type": "text", "x": 1}}),
    ("completions", {"model": "m", "prompt": "p"}, {"logprobs": 0}),
    ("embeddings", {"model": "m", "input": "x"}, {"encoding_format": "float"}),
])
def test_what_is_not_the_default_stays(route, body, close):
    assert cj(route, {**body, **close}) != cj(route, body)


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


UNKEYED = {"user": "u1", "stream": True, "stream_options": {"include_usage": True}, "metadata": {"b": "1", "a": "2"},
           "store": True, "service_tier": "priority", "prompt_cache_key": "k", "safety_identifier": "s",
           "prompt_cache_retention": "24h", "prompt_cache_options": {"mode": "explicit"}}


def test_unkeyed_fields_stay_out_of_the_key_and_are_sent_as_they_came():
    assert set(UNKEYED) == UNKEYED_FIELDS
    out = canonicalize("chat.completions", chat("q", **UNKEYED))
    assert out.key == chat("q")
    assert out.rules == ("unkeyed_field",) * len(UNKEYED_FIELDS)
    assert {k: out.sent[k] for k in UNKEYED} == UNKEYED
    assert list(out.sent["metadata"]) == ["b", "a"]


def test_max_tokens_and_max_completion_tokens_stay_distinct():
    assert cj("chat.completions", chat("q", max_tokens=5)) != cj("chat.completions",
                                                                  chat("q", max_completion_tokens=5))


def test_float_parameters_take_one_number_form_and_nothing_else_does():
    out = canonicalize("chat.completions", chat("q", temperature=1.0, top_p=0.5, frequency_penalty=2.0,
                                                logit_bias={"5": -100.0}, vendor={"x": [2.0]}))
    assert out.key["temperature"] == 1 and type(out.key["temperature"]) is int and out.key["top_p"] == 0.5
    assert type(out.key["frequency_penalty"]) is int and type(out.key["logit_bias"]["5"]) is int
    assert type(out.key["vendor"]["x"][0]) is float
    assert out.rules == ("number_form",) * 3
    assert cj("chat.completions", chat("q", temperature=0.0)) == cj("chat.completions", chat("q", temperature=0))


def test_numbers_are_written_as_they_are_and_bools_are_not_numbers():
    assert canonical_json([True, 1, 1.0, -0.0]) == b"[true,1,1.0,-0.0]"
    assert value_json([True, 1, 1.0, {"b": 2.0, "a": 1e16}]) == b'[true,1,1,{"a":10000000000000000,"b":2}]'


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


# What a chat_body holds that the gateway does not know: kept in its order, so not shuffled.
UNKNOWN_MEMBERS = ("parameters", "x_vendor", "extra")


def _shuffled(value, rng):
    """`value` with the member order of every object the gateway knows shuffled."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: v if k in UNKNOWN_MEMBERS else _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


def _reversed_objects(value):
    if isinstance(value, dict):
        return {k: _reversed_objects(value[k]) for k in reversed(value)}
    if isinstance(value, list):
        return [_reversed_objects(v) for v in value]
    return value


def _has_ordered_object(value):
    if isinstance(value, dict):
        return len(value) > 1 or any(map(_has_ordered_object, value.values()))
    return isinstance(value, list) and any(map(_has_ordered_object, value))


@PROPS
@given(chat_body, st.randoms(use_true_random=False))
def test_member_order_of_known_objects_never_matters(body, rng):
    assert cj("chat.completions", _shuffled(body, rng)) == cj("chat.completions", body)


@PROPS
@given(chat_body, json_values)
def test_member_order_inside_an_unknown_member_always_matters(body, vendor):
    body = {**body, "extra": vendor}
    flipped = {**body, "extra": _reversed_objects(vendor)}
    same = cj("chat.completions", flipped) == cj("chat.completions", body)
    assert same != _has_ordered_object(vendor)


def _dirty(s, rng):
    out = []
    for ch in s:
        if rng.random() < 0.3:
            out.append(rng.choice(INVISIBLE))
        out.append(rng.choice(["\r\n", "\n"]) if ch == "\n" else ch)
    return "".join(out) + rng.choice(["", *INVISIBLE])


@PROPS
@given(st.lists(text.filter(lambda s: "\r" not in s), min_size=1, max_size=3), st.randoms(use_true_random=False))
def test_invisible_chars_and_line_endings_never_matter(contents, rng):
    assert cj("chat.completions", chat(*[_dirty(c, rng) for c in contents])) == cj("chat.completions", chat(*contents))
    assert cj("embeddings", {"model": "m", "input": [_dirty(c, rng) for c in contents]}) == \
        cj("embeddings", {"model": "m", "input": contents})


@PROPS
@given(text)
def test_clean_text_is_nfc_between_kept_characters_and_keeps_what_is_visible(s):
    out = canonicalize("completions", {"model": "m", "prompt": s}).key["prompt"]
    runs = re.split(f"[{re.escape(KEPT_FROM_NFC)}]", out)
    assert all(unicodedata.is_normalized("NFC", run) for run in runs)
    assert [c for c in out if c in KEPT_FROM_NFC] == [c for c in s if c in KEPT_FROM_NFC]
    assert not any(c in out for c in INVISIBLE) and "\r\n" not in out
    assert out.count("\r") == s.count("\r") - s.count("\r\n")
    for joiner in ("\u200d", "\u200c"):
        assert out.count(joiner) == s.count(joiner)


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
                 stop=["b", "a", "b"], seed=None, temperature=1.0, user="u", n=1)
    fired = set(canonicalize("chat.completions", dirty).rules)
    fired |= set(canonicalize("embeddings", {"model": "m", "input": ["x"]}).rules)
    fired |= set(canonicalize("responses", {"model": "m", "input": [{"id": "msg_1", "role": "user", "content": "x"}]}).rules)
    assert fired == set(RULES)
