"""A `store: false` answer names nothing the upstream keeps: it is never served to a
`store: true` asker, whose next turn must find its answer upstream; whether a
conversation can continue does not depend on who asked first (issue 44)."""
from __future__ import annotations

import openai
import pytest

from tenant_pair import openai_as, start

ASK = {"model": "fake/m1", "input": "Pick a colour."}


@pytest.mark.parametrize("first", [False, True])
def test_store_false_and_true_askers_are_kept_apart(upstream, claude, gateway, redis_url, first):
    fake, _ = upstream
    gw = start(gateway, upstream, claude, redis_url, shared_cache_tenants=["alice", "bob"])
    alice, bob = openai_as(gw, "alice"), openai_as(gw, "bob")
    before = alice.responses.with_raw_response.create(**ASK, store=first)
    after = bob.responses.with_raw_response.create(**ASK, store=not first)
    assert [r.headers["x-detgate-cache"] for r in (before, after)] == ["miss", "miss"]
    assert before.headers["x-detgate-key"] != after.headers["x-detgate-key"]
    kept = (before if first else after).parse()
    assert kept.store is True and kept.id in fake.responses.stored
    owner = alice if first else bob
    nxt = owner.responses.create(model="fake/m1", input="Why that one?", previous_response_id=kept.id)
    assert nxt.previous_response_id == kept.id
    unkept = (after if first else before).parse()
    assert unkept.store is False and unkept.id not in fake.responses.stored
    again = (bob if first else alice).responses.with_raw_response.create(**ASK, store=False)
    assert again.headers["x-detgate-cache"] == "hit" and again.parse().id == unkept.id


def test_a_store_false_turn_fails_upstream_as_it_would_direct(upstream, claude, gateway, redis_url):
    gw = start(gateway, upstream, claude, redis_url)
    alice = openai_as(gw, "alice")
    unkept = alice.responses.create(**ASK, store=False)
    with pytest.raises(openai.NotFoundError) as caught:
        alice.responses.create(model="fake/m1", input="Why?", previous_response_id=unkept.id)
    assert caught.value.code == "previous_response_not_found"
