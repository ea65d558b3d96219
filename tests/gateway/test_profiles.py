import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.apis import SURFACES
from gateway.policy.canonical import canonical_json
from gateway.apis.choices import merge_n
from gateway.policy.capabilities import ANY, Capability, CapabilitySpec, table
from gateway.policy.profiles import (
    MODES,
    OPENAI_ALIASES,
    PROFILES,
    Profile,
    RandomnessError,
    amended,
    derandomize,
    parse_mode,
    profile_from_dict,
    resolve_model,
    split_n,
    unsent,
)

OPENAI, GENERIC, WHITEBOX = PROFILES["openai"], PROFILES["generic-openai-compatible"], PROFILES["whitebox"]
BUILT_IN_TABLE = table()


def chat(**params):
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **params}


def test_enforce_takes_every_source_of_randomness_out():
    body, warnings = derandomize(SURFACES["chat.completions"].sampling, chat(top_p=0.9, top_k=40), OPENAI, "enforce")
    assert body == chat(temperature=0, top_p=1, seed=0)
    assert warnings == ["temperature set to 0 (was absent)", "top_p forced to 1 (was 0.9)",
                        "top_k removed", "seed set to 0 (was absent)"]
    assert all(w.isascii() and "\n" not in w for w in warnings)


def test_enforce_on_an_already_deterministic_request_changes_nothing_and_warns_nothing():
    request = chat(temperature=0, top_p=1, seed=7)
    assert derandomize(SURFACES["chat.completions"].sampling, request, OPENAI, "enforce") == (request, [])


def test_absent_top_p_is_made_explicit_without_a_warning():
    body, warnings = derandomize(SURFACES["completions"].sampling, {"model": "m", "prompt": "p", "temperature": 0, "seed": 1},
                                 GENERIC, "enforce")
    assert body["top_p"] == 1 and warnings == []


def test_null_counts_as_absent():
    body, _ = derandomize(SURFACES["chat.completions"].sampling, chat(temperature=None, seed=None, top_p=None), OPENAI, "enforce")
    assert body["temperature"] == 0 and body["seed"] == 0 and body["top_p"] == 1


def test_positive_temperature_is_kept_but_warned_about_on_black_box_providers():
    body, warnings = derandomize(SURFACES["chat.completions"].sampling, chat(temperature=0.7, seed=3), OPENAI, "enforce")
    assert body["temperature"] == 0.7
    assert warnings == ["temperature 0.7 samples; m honours a seed on a best-effort basis only"]


def test_a_profile_that_cannot_take_zero_sends_a_tiny_positive_value():
    tiny = profile_from_dict({"name": "fussy", "zero_temperature": 1e-5})
    body, warnings = derandomize(SURFACES["chat.completions"].sampling, chat(seed=1), tiny, "enforce")
    assert body["temperature"] == 1e-5 and warnings == ["temperature set to 1e-05 (was absent)"]
    body, warnings = derandomize(SURFACES["chat.completions"].sampling, chat(temperature=0, seed=1), tiny, "enforce")
    assert body["temperature"] == 1e-5 and "reads 0 as its default" in warnings[0]
    assert derandomize(SURFACES["chat.completions"].sampling, body, tiny, "enforce") == (body, [])
    assert derandomize(SURFACES["chat.completions"].sampling, body, tiny, "reject") == (body, [])


def test_whitebox_keeps_sampling_as_given_but_fixes_the_seed():
    request = chat(temperature=0.8, top_p=0.5, top_k=20)
    body, warnings = derandomize(SURFACES["chat.completions"].sampling, request, WHITEBOX, "enforce")
    assert body == {**request, "seed": 0} and warnings == ["seed set to 0 (was absent)"]
    assert derandomize(SURFACES["chat.completions"].sampling, chat(seed=5), WHITEBOX, "enforce") == (chat(seed=5), [])


@pytest.mark.parametrize("request_, param", [
    (chat(seed=1), "temperature"),
    (chat(temperature=0, seed=1, top_p=0.5), "top_p"),
    (chat(temperature=0, seed=1, top_k=5), "top_k"),
    (chat(temperature=0), "seed"),
    (chat(temperature=1.2, seed=1), "temperature"),
])
def test_reject_names_the_parameter_that_adds_randomness(request_, param):
    with pytest.raises(RandomnessError) as err:
        derandomize(SURFACES["chat.completions"].sampling, request_, OPENAI, "reject")
    error = err.value.error()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert set(error) == {"message", "type", "param", "code"} and param in error["message"]


def test_reject_passes_a_deterministic_request_untouched():
    request = chat(temperature=0, seed=1)
    assert derandomize(SURFACES["chat.completions"].sampling, request, OPENAI, "reject") == (request, [])


def test_off_and_embeddings_pass_through():
    request = chat(top_k=3)
    assert derandomize(SURFACES["chat.completions"].sampling, request, OPENAI, "off") == (request, [])
    emb = {"model": "e", "input": "x"}
    assert derandomize(SURFACES["embeddings"].sampling, emb, OPENAI, "enforce") == (emb, [])


def test_unknown_mode_is_an_error():
    with pytest.raises(ValueError):
        derandomize(SURFACES["chat.completions"].sampling, chat(), OPENAI, "sometimes")


def test_parse_mode():
    assert [parse_mode(m.upper() + " ") for m in MODES] == list(MODES)
    with pytest.raises(ValueError, match="enforce, reject, off"):
        parse_mode("strict")


def test_n_is_refused_by_a_reject_profile_in_both_modes():
    strict = profile_from_dict({"name": "one-at-a-time", "n_policy": "reject"})
    for mode in ("enforce", "reject"):
        with pytest.raises(RandomnessError) as err:
            derandomize(SURFACES["chat.completions"].sampling, chat(temperature=0, seed=1, n=3), strict, mode)
        assert err.value.param == "n"
    assert derandomize(SURFACES["chat.completions"].sampling, chat(n=3), strict, "off")[0]["n"] == 3


def test_n_split_plan_has_consecutive_seeds_and_one_answer_each():
    body, _ = derandomize(SURFACES["chat.completions"].sampling, chat(n=3, seed=10), OPENAI, "enforce")
    plan = split_n(body)
    assert [p["seed"] for p in plan] == [10, 11, 12]
    assert all("n" not in p and p["messages"] == body["messages"] for p in plan)
    assert split_n(chat(seed=1)) == [chat(seed=1)] and split_n(chat(n=1)) == [chat(n=1)]


def test_sub_requests_get_distinct_keys():
    plan = split_n(derandomize(SURFACES["chat.completions"].sampling, chat(n=4), OPENAI, "enforce")[0])
    assert len({canonical_json(SURFACES["chat.completions"].canonical(p, True).key) for p in plan}) == 4


def response(i, text, completion_tokens=3):
    return {"id": f"chatcmpl-{i}", "object": "chat.completion", "created": 100 + i, "model": "m",
            "system_fingerprint": f"fp{i}",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": completion_tokens,
                      "total_tokens": 5 + completion_tokens,
                      "completion_tokens_details": {"reasoning_tokens": 1}}}


def test_merge_n_keeps_plan_order_and_bills_the_prompt_once():
    merged = merge_n([response(0, "a", 2), response(1, "b", 3), response(2, "c", 4)])
    assert [c["message"]["content"] for c in merged["choices"]] == ["a", "b", "c"]
    assert [c["index"] for c in merged["choices"]] == [0, 1, 2]
    assert merged["id"] == "chatcmpl-0" and merged["created"] == 100 and merged["system_fingerprint"] == "fp0"
    assert merged["usage"]["prompt_tokens"] == 5 and merged["usage"]["completion_tokens"] == 9
    assert merged["usage"]["total_tokens"] == 14
    assert merged["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}


def test_merge_n_without_usage_everywhere_leaves_the_first_usage_alone():
    parts = [response(0, "a"), {**response(1, "b")}]
    del parts[1]["usage"]
    assert merge_n(parts)["usage"] == parts[0]["usage"]
    with pytest.raises(ValueError):
        merge_n([])


@settings(max_examples=60, deadline=None)
@given(st.fixed_dictionaries({}, optional={
    "temperature": st.none() | st.floats(0, 2), "top_p": st.none() | st.floats(0, 1),
    "top_k": st.integers(0, 50), "seed": st.none() | st.integers(0, 2**31), "n": st.integers(1, 4)}),
    st.sampled_from([*PROFILES.values(), Profile("fussy", zero_temperature=1e-5)]))
def test_enforce_is_idempotent_and_pure(params, profile):
    request = chat(**params)
    before = copy.deepcopy(request)
    once, _ = derandomize(SURFACES["chat.completions"].sampling, request, profile, "enforce")
    assert request == before
    again, warnings = derandomize(SURFACES["chat.completions"].sampling, once, profile, "enforce")
    assert again == once
    assert all(w.startswith("temperature ") for w in warnings)  # only the best-effort note repeats
    # What enforce produced, reject accepts, unless it samples on a black-box provider.
    if not (profile.fix_sampling and once["temperature"] not in (0, profile.zero_temperature)):
        assert derandomize(SURFACES["chat.completions"].sampling, once, profile, "reject") == (once, [])


def test_user_defined_profile_from_config():
    p = profile_from_dict({"name": "local-vllm", "base": "whitebox", "seed": 42})
    assert p == Profile("local-vllm", default_temperature=None, fix_sampling=False, seed=42, votes=False,
                        decodes_strict_schemas=True)
    assert profile_from_dict({"name": "y", "base": "openai"}).aliases == OPENAI_ALIASES
    assert profile_from_dict({"name": "x"}) == Profile("x")


@pytest.mark.parametrize("spec, complaint", [
    ({}, "name"),
    ({"name": "x", "base": "nope"}, "unknown base"),
    ({"name": "x", "temprature": 0}, "unknown fields"),
    ({"name": "x", "zero_temperature": 0.5}, "zero_temperature"),
    ({"name": "x", "seed": "1"}, "seed"),
    ({"name": "x", "n_policy": "merge"}, "n_policy"),
    ({"name": "x", "fix_sampling": 1}, "fix_sampling"),
    ({"name": "x", "decodes_strict_schemas": "yes"}, "decodes_strict_schemas"),
    ({"name": "x", "default_temperature": "0"}, "default_temperature"),
    ({"name": "x", "default_temperature": -1}, "default_temperature"),
])
def test_bad_profile_specs_are_named(spec, complaint):
    with pytest.raises(ValueError, match=complaint):
        profile_from_dict(spec)


def test_aliases_belong_to_the_openai_profile_and_config_amends_them():
    aliases = OPENAI.aliases
    assert resolve_model("gpt-4o", aliases) == ("gpt-4o-2024-08-06", True)
    assert resolve_model("gpt-4o-2024-08-06", aliases) == ("gpt-4o-2024-08-06", False)
    assert resolve_model("my-finetune", aliases) == ("my-finetune", False)
    # An Azure, OpenRouter or vLLM upstream serves its own names: nothing is pinned for it.
    assert GENERIC.aliases == {} and WHITEBOX.aliases == {}
    table = amended(aliases, {"gpt-4o": "gpt-4o-2024-11-20", "gpt-4o-mini": False, "gpt-4": None,
                              "fast": "gpt-4.1-nano-2025-04-14"})
    assert resolve_model("gpt-4o", table) == ("gpt-4o-2024-11-20", True)
    assert resolve_model("gpt-4o-mini", table) == ("gpt-4o-mini", False)
    assert resolve_model("gpt-4", table) == ("gpt-4", False)
    assert resolve_model("fast", table) == ("gpt-4.1-nano-2025-04-14", True)
    assert OPENAI.aliases == OPENAI_ALIASES  # amended is a copy


def test_a_user_profile_amends_its_bases_aliases():
    azure = profile_from_dict({"name": "azure", "aliases": {"gpt-4o": "prod-4o"}})
    assert azure.aliases == {"gpt-4o": "prod-4o"}
    mirror = profile_from_dict({"name": "mirror", "base": "openai", "aliases": {"gpt-4": False}})
    assert "gpt-4" not in mirror.aliases and mirror.aliases["gpt-4o"] == OPENAI_ALIASES["gpt-4o"]
    for bad in ({"gpt-4o": 5}, ["gpt-4o"], {"gpt-4o": ""}):
        with pytest.raises(ValueError, match="aliases"):
            profile_from_dict({"name": "x", "aliases": bad})


def test_openai_aliases_point_at_dated_snapshots_never_at_other_aliases():
    assert not set(OPENAI_ALIASES.values()) & set(OPENAI_ALIASES)
    assert all(pinned.startswith(name + "-") for name, pinned in OPENAI_ALIASES.items())


# ---------------------------------------------------------------- capabilities

CHAT_SAMPLING = SURFACES["chat.completions"].sampling
REASONING = BUILT_IN_TABLE.of("o3-2025-04-16")


@pytest.mark.parametrize("model", ["o1-2024-12-17", "o1-mini", "o3", "o3-mini-2025-01-31", "o4-mini-2025-04-16",
                                   "gpt-5-2025-08-07", "gpt-5-mini", "gpt-5.1", "gpt-5-nano-2025-08-07"])
def test_openai_reasoning_models_take_no_temperature_or_top_p(model):
    capability = BUILT_IN_TABLE.of(model)
    assert capability.accepts == {"seed"} and not capability.honours_seed


@pytest.mark.parametrize("model", ["gpt-5-chat-latest", "gpt-4o-2024-08-06", "gpt-4.1", "llama-3-8b"])
def test_other_models_take_temperature_and_top_p(model):
    assert {"temperature", "top_p", "seed"} <= BUILT_IN_TABLE.of(model).accepts


def test_config_rows_come_before_the_built_in_ones():
    configured = table([("o3*", CapabilitySpec(accepts=("temperature", "seed"))),
                        ("my-deployment", CapabilitySpec(accepts=(), honours_seed=True))])
    assert configured.of("o3-2025-04-16").accepts == {"temperature", "seed"}
    assert configured.of("o4-mini").accepts == {"seed"}
    nothing = configured.of("my-deployment")
    assert nothing.accepts == frozenset() and not nothing.honours_seed  # no seed, nothing to honour
    assert configured.of("unlisted") == ANY
    with pytest.raises(ValueError):
        CapabilitySpec(accepts=("temperature", "min_p"))


def test_enforce_never_sends_what_a_reasoning_model_refuses_and_says_so():
    body, warnings = derandomize(CHAT_SAMPLING, chat(model="o3", temperature=0.2, top_p=0.5), OPENAI, "enforce",
                                 REASONING)
    assert body == chat(model="o3", seed=0)
    assert warnings == ["temperature removed: o3 does not accept it", "top_p removed: o3 does not accept it",
                        "seed set to 0 (was absent)"]
    # Nothing is added that the model refuses either: no default temperature, no explicit top_p.
    assert derandomize(CHAT_SAMPLING, chat(model="o3", seed=4), OPENAI, "enforce", REASONING) == \
        (chat(model="o3", seed=4), [])


@pytest.mark.parametrize("request_, param", [
    (chat(model="o3", temperature=0, seed=1), "temperature"),
    (chat(model="o3", top_p=1, seed=1), "top_p"),
    (chat(model="o3", top_k=1, seed=1), "top_k"),
])
def test_reject_names_the_parameter_the_model_refuses(request_, param):
    with pytest.raises(RandomnessError) as err:
        derandomize(CHAT_SAMPLING, request_, OPENAI, "reject", REASONING)
    error = err.value.error()["error"]
    assert (error["param"], error["code"]) == (param, "unsupported_parameter")
    assert "o3 does not accept it" in error["message"]


def test_a_seed_the_model_refuses_is_keyed_never_sent():
    no_seed = Capability(frozenset({"temperature", "top_p", "top_k"}), honours_seed=False)
    body, warnings = derandomize(CHAT_SAMPLING, chat(temperature=0), OPENAI, "enforce", no_seed)
    assert body["seed"] == 0 and warnings == []  # chosen for the key; what is sent did not change
    assert unsent(CHAT_SAMPLING, no_seed, "enforce") == unsent(CHAT_SAMPLING, no_seed, "reject") == {"seed"}
    assert unsent(CHAT_SAMPLING, ANY, "enforce") == frozenset()
    assert unsent(CHAT_SAMPLING, no_seed, "off") == frozenset()  # off sends the body as it came
    body, warnings = derandomize(CHAT_SAMPLING, chat(temperature=0, seed=7), OPENAI, "enforce", no_seed)
    assert body["seed"] == 7 and warnings == ["seed 7 kept in the key, not sent: m does not accept it"]
    with pytest.raises(RandomnessError) as err:
        derandomize(CHAT_SAMPLING, chat(temperature=0, seed=7), OPENAI, "reject", no_seed)
    assert (err.value.param, err.value.code) == ("seed", "unsupported_parameter")
    # In reject mode nothing is asked of the client that the model would refuse.
    assert derandomize(CHAT_SAMPLING, chat(temperature=0), OPENAI, "reject", no_seed) == (chat(temperature=0), [])


def test_a_wire_without_seeds_keys_the_seed_it_does_not_send():
    wire = frozenset({"temperature", "top_p"})  # the Responses API's
    body, warnings = derandomize(wire, chat(), OPENAI, "enforce")
    assert (body["temperature"], body["top_p"], body["seed"]) == (0, 1, 0) and warnings == [
        "temperature set to 0 (was absent)"]
    assert unsent(wire, ANY, "enforce") == {"seed", "top_k"}
    plan = split_n({**body, "n": 3})
    assert [p["seed"] for p in plan] == [0, 1, 2]  # parts stay apart in the key


def test_the_best_effort_note_says_whether_the_model_honours_seeds():
    _, honoured = derandomize(CHAT_SAMPLING, chat(temperature=0.7, seed=1), OPENAI, "enforce")
    ignored = Capability(frozenset({"temperature", "top_p", "seed"}), honours_seed=False)
    _, not_honoured = derandomize(CHAT_SAMPLING, chat(temperature=0.7, seed=1), OPENAI, "enforce", ignored)
    assert honoured == ["temperature 0.7 samples; m honours a seed on a best-effort basis only"]
    assert not_honoured == ["temperature 0.7 samples; m does not honour a seed: each call may answer differently"]
