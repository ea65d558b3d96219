"""What the policy puts into the key's strategy part: everything that can change which answer is stored."""
from __future__ import annotations

import pytest

from gateway.apis import SURFACES
from gateway.config import Settings
from gateway.errors import ApiError
from gateway.policy.apply import Hints, apply_policy

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
SCHEMA = {"type": "object", "required": ["a"]}


def policy(body=CHAT, hints=Hints(None, None, None), **settings):
    s = Settings.model_validate({"upstreams": ["u=http://127.0.0.1:1/v1"], **settings})
    return apply_policy(SURFACES["chat.completions"], body, s.upstreams[0], s.rules, hints)


def test_a_plain_request_is_single_and_a_vote_names_its_k():
    assert policy().spec.name == "single"
    assert policy(hints=Hints(None, "1", None)).spec.name == "single"
    assert policy(hints=Hints(None, "3", None)).spec.name == "vote:3"


def test_the_extractor_schema_attempts_and_feedback_are_in_the_name():
    base = {"strategies": {"m*": {"vote": 3, "extractor": {"json_pointer": "/a"}, "schema": "s", "attempts": 2}},
            "schemas": {"s": SCHEMA}}
    name = policy(**base).spec.name
    assert name.startswith("vote:3@") and "+schema:2@s:" in name
    assert policy(**base, schema_feedback=True).spec.name != name
    # Editing the named schema in config must not serve answers checked against the old one.
    changed = {**base, "schemas": {"s": {**SCHEMA, "required": ["b"]}}}
    assert policy(**changed).spec.name != name
    other_extractor = {**base, "strategies": {"m*": {**base["strategies"]["m*"], "extractor": {"json_pointer": "/b"}}}}
    assert policy(**other_extractor).spec.name != name


def test_a_request_schema_and_tools_turn_checking_on():
    with_format = {**CHAT, "response_format": {"type": "json_object"}}
    assert policy(with_format).spec.name == "schema:3" and policy(with_format).spec.schema == {"type": "object"}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    spec = policy({**CHAT, "tools": tools}).spec
    assert spec.check and spec.schema is None


def test_refusals_name_the_parameter():
    with pytest.raises(ApiError) as refused:
        policy({**CHAT, "temperature": 0, "seed": 1, "top_p": 0.5}, Hints("reject", None, None))
    assert (refused.value.status, refused.value.param, refused.value.code) == (400, "top_p", "nondeterministic_parameter")
