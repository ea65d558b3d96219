"""Settling a canonical tree once: prepare signs `settled_json` of a canonical key (key
rules applied) instead of settling it again, and canonicalize settles the key and what is
sent in one walk; each must give exactly what the separate passes give."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.apis import SURFACES
from gateway.policy import key_rules
from gateway.policy.canonical import OrderedObject, Unkeyed, _settle, _settle_both, canonical_json, settled_json
from gateway.policy.key_rules import KeyRule

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-2, 2) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=12,
)
extra = st.dictionaries(st.sampled_from(["zeta", "alpha", "metadata", "user", "b", "a"]), json_values, max_size=3)
schemas = st.dictionaries(st.sampled_from(["type", "properties", "required", "z", "a"]), json_values, max_size=3)
text = st.text(alphabet="ab1 \r\n\u200b\ufeff", max_size=8)
rules = st.lists(st.one_of(
    st.builds(lambda p: KeyRule(name="p", path=p), st.sampled_from(["alpha", "*", "**.b", "messages[*]", "a.b"])),
    st.builds(lambda p, r: KeyRule(name="t", pattern=p, replace=r), st.sampled_from([r"\d", "a+", "^b"]),
              st.sampled_from(["", "<n>", r"\g<0>!"])),
), max_size=3, unique_by=lambda rule: (rule.path, rule.pattern, rule.replace))


@st.composite
def bodies(draw):
    surface = draw(st.sampled_from(["chat.completions", "messages", "responses"]))
    tool = {"name": "f", "description": draw(text), "input_schema": draw(schemas)}
    if surface == "chat.completions":
        body = {"model": "m", "messages": [{"role": "user", "content": draw(text)}],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": draw(schemas)}}]}
    elif surface == "messages":
        body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": draw(text)}],
                "tools": [tool]}
    else:
        body = {"model": "m", "input": [{"role": "user", "content": draw(text), "id": "msg_1"}],
                "tools": [{"type": "function", "name": "f", "parameters": draw(schemas)}]}
    return SURFACES[surface], {**draw(extra), **body}


@settings(max_examples=200, deadline=None)
@given(bodies(), st.booleans(), rules)
def test_a_settled_key_is_written_as_canonical_json_writes_it(surface_body, text_rules, key_rule_set):
    surface, body = surface_body
    key = surface.canonical(body, text_rules).key
    tree, _ = key_rules.apply(key, tuple(key_rule_set))
    assert settled_json(tree) == canonical_json(tree)
    assert settled_json(key) == canonical_json(key)


def _marked(tree):
    """The tree with some members wrapped as Unkeyed and some objects as OrderedObjects."""
    if isinstance(tree, dict):
        out = {k: Unkeyed(v) if k.startswith("u") else _marked(v) for k, v in tree.items()}
        return OrderedObject(out) if "o" in tree else out
    if isinstance(tree, list):
        return [_marked(item) for item in tree]
    return tree


def _shape(value):
    """A value with the type of each object made visible, for exact comparison."""
    if isinstance(value, dict):
        return (type(value).__name__, [(k, _shape(v)) for k, v in value.items()])
    if isinstance(value, list):
        return [_shape(item) for item in value]
    return (type(value).__name__, value)


trees = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-2, 2) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "o", "u", "ub", "z"]), inner,
                                                                max_size=4),
    max_leaves=16,
)


@settings(max_examples=300, deadline=None)
@given(trees)
def test_one_walk_gives_the_key_and_what_is_sent_as_two_walks_do(tree):
    tree = _marked(tree)
    key, sent = _settle_both(tree, False)
    assert _shape(key) == _shape(_settle(tree, False, False))
    assert _shape(sent) == _shape(_settle(tree, False, False, keyed=False))
    assert canonical_json(key) == settled_json(key)
