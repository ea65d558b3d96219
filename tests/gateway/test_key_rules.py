"""Key rules as pure functions: which agent a user-agent names, which rules apply in which
mode, what a rule leaves out of the key, and what is signed for the rules that fired."""
from __future__ import annotations

import copy

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gateway.apis import SURFACES

from gateway.config import Settings
from gateway.policy.canonical import OrderedObject, canonical_json
from gateway.policy.key_rules import BUILTIN, KeyRule, applicable, apply, recognise, schema, warning


@pytest.mark.parametrize("user_agent, agent", [
    ("claude-cli/2.1.197 (external, sdk-cli)", "claude-code"),
    ("claude-cli/2.0.1 (external, cli)", "claude-code"),
    ("codex_exec/0.171.0 (Debian 12.0.0; x86_64) dumb (codex_exec; 0.171.0)", "codex"),
    ("codex_cli_rs/0.40.0 (Mac OS 15.1.0; arm64) iTerm.app/3.5.10", "codex"),
    ("Agents/Python 0.24.0", "openai-agents"),
    ("OpenAI/Python 3.57.0", None),
    ("Anthropic/Python 2.14.0", None),
    ("Bun/1.4.0", None),
    ("my-claude-cli/1.0", None),
    (None, None),
])
def test_agents_are_recognised_by_their_user_agent(user_agent, agent):
    assert recognise(user_agent) == agent


def test_built_in_rules_apply_in_record_and_replay_unless_told_otherwise():
    mine = (KeyRule(name="mine", path="x"),)
    codex = BUILTIN["codex"]
    assert applicable("codex", "record", "auto", mine) == (*codex, *mine)
    assert applicable("codex", "replay", "auto", ()) == codex
    assert applicable("codex", "normal", "auto", mine) == mine  # a new day is a new question
    assert applicable("codex", "normal", "on", ()) == codex
    assert applicable("codex", "replay", "off", mine) == mine
    assert applicable(None, "replay", "on", mine) == mine


@pytest.mark.parametrize("agent, before, after", [
    ("claude-code", "# currentDate\nToday's date is 2026-11-28.\n", "# currentDate\nToday's date is <date>.\n"),
    ("codex", "  <current_date>2026-11-28</current_date>\n", "  <current_date><date></current_date>\n"),
    ("codex", "Script completed\nWall time 0.1 seconds\nOutput:\n", "Script completed\nWall time <seconds> seconds\nOutput:\n"),
    ("codex", "Chunk ID: 7f3a2c\nWall time: 0.0012 seconds\nProcess exited with code 0\n",
     "Chunk ID: <id>\nWall time <seconds> seconds\nProcess exited with code 0\n"),
    # Only where the agent writes them: the same words inside a line are the model's text.
    ("codex", "it said Wall time 3 seconds here", "it said Wall time 3 seconds here"),
    ("claude-code", "Today's date is 2026-11-28 (in Paris)", "Today's date is 2026-11-28 (in Paris)"),
])
def test_built_in_rules_cover_what_the_real_agents_write(agent, before, after):
    key, fired = apply({"text": before}, BUILTIN[agent])
    assert key == {"text": after} and bool(fired) == (before != after)


def test_path_rules_leave_values_out_and_pattern_rules_rewrite_text_in_the_key_only():
    key = {"input": [{"id": "msg_1", "text": "run 42", "meta": OrderedObject({"b": "7", "a": 1})}],
           "client": {"turn": "t-1"}, "keep": "run 9"}
    before = copy.deepcopy(key)
    rules = (KeyRule(name="ids", path="$.input[*].id"), KeyRule(name="client", path="client"),
             KeyRule(name="numbers", path="**.text", pattern=r"\d+", replace="N"),
             KeyRule(name="any", path="input[0].meta.*", pattern="7", replace="seven"))
    out, fired = apply(key, rules)
    assert out == {"input": [{"text": "run N", "meta": {"b": "seven", "a": 1}}], "keep": "run 9"}
    assert [rule.name for rule in fired] == ["ids", "client", "numbers", "any"]
    assert type(out["input"][0]["meta"]) is OrderedObject and list(out["input"][0]["meta"]) == ["b", "a"]
    assert key == before  # never mutated
    assert canonical_json(out) == b'{"input":[{"meta":{"b":"seven","a":1},"text":"run N"}],"keep":"run 9"}'


def test_a_rule_that_changes_nothing_has_not_fired_and_signs_nothing():
    key = {"a": "b"}
    out, fired = apply(key, (KeyRule(name="x", path="z"), KeyRule(name="y", pattern="q")))
    assert out is key and fired == () and schema(fired) == b"" and warning(()) is None


def test_what_is_signed_is_each_fired_rule_whole():
    one, other = KeyRule(name="d", pattern=r"\d", replace="N"), KeyRule(name="d", pattern=r"\d+", replace="N")
    assert schema((one,)) != schema((other,))  # same name, another rule: another key
    assert schema((one,)) == b'[{"name":"d","path":null,"pattern":"\\\\d","replace":"N"}]'


@pytest.mark.parametrize("rule, error", [
    ({"name": "x"}, "needs a path"),
    ({"name": "x", "pattern": "("}, "missing \\)"),
    ({"name": "x", "pattern": "a", "replace": "\\2"}, "invalid group reference"),
    ({"name": "bad name", "path": "x"}, "name"),
    ({"name": "x", "path": "x", "extra": 1}, "extra"),
])
def test_a_bad_rule_refuses_to_start(rule, error):
    with pytest.raises(ValidationError, match=error):
        Settings.model_validate({"key_rules": [rule]})


def test_rule_names_are_unique():
    with pytest.raises(ValidationError, match="unique"):
        Settings.model_validate({"key_rules": [{"name": "x", "path": "a"}, {"name": "x", "path": "b"}]})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=10,
)
rules = st.lists(st.one_of(
    st.builds(lambda p: KeyRule(name="p", path=p), st.sampled_from(["a", "*", "**.b", "a[*]", "$.a.b", "x[0]"])),
    st.builds(lambda p, r: KeyRule(name="t", pattern=p, replace=r), st.sampled_from([r"\d", "a+", "^b"]),
              st.sampled_from(["", "<n>", r"\g<0>!"])),
), max_size=3, unique_by=lambda rule: (rule.path, rule.pattern, rule.replace))


@settings(max_examples=150, deadline=None)
@given(json_values, rules)
def test_rules_never_mutate_and_report_exactly_what_changed(value, chosen):
    for i, rule in enumerate(chosen):
        chosen[i] = rule.model_copy(update={"name": f"r{i}"})
    before = copy.deepcopy(value)
    out, fired = apply(value, tuple(chosen))
    assert value == before
    assert bool(fired) == (out != value)  # a rule fires only when it changed something
    orjson.dumps(out)
    for rule in fired:  # each fired rule alone changes the value too
        assert apply(value, (rule,))[0] != value


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["message", "function_call_output", "custom_tool_call_output",
                                           "additional_tools", "reasoning", "item_reference"]),
                          st.text(min_size=1, max_size=12)), min_size=1, max_size=5),
       json_values)
def test_client_ids_and_metadata_are_sent_as_they_came_and_never_keyed(items, metadata):
    body = {"model": "m", "client_metadata": metadata, "input": [
        {"type": kind, "id": ident, "role": "user", "call_id": "c", "output": "o", "content": "x"}
        for kind, ident in items]}
    canonical = SURFACES["responses"].canonical(body, True)
    assert canonical.sent["client_metadata"] == metadata and "client_metadata" not in canonical.key
    assert [item["id"] for item in canonical.sent["input"]] == [ident for _, ident in items]
    # Only the ids that name upstream state (a reasoning item, an item reference) are keyed.
    assert [item.get("id") for item in canonical.key["input"]] == [
        ident if kind in ("reasoning", "item_reference") else None for kind, ident in items]
