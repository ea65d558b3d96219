"""Proxied routes that name an object (a stored response, its input items, a background
response polled for) act only for the tenant that was served or made it: another gets
the wire's 404 and the operator's key never carries its call (issue 44)."""
from __future__ import annotations

import openai
import pytest

from tenant_pair import openai_as, start


def test_a_stored_response_is_read_listed_and_deleted_by_its_tenant_alone(upstream, claude, gateway, redis_url):
    fake, _ = upstream
    gw = start(gateway, upstream, claude, redis_url)
    alice, bob = openai_as(gw, "alice"), openai_as(gw, "bob")
    made = alice.responses.create(model="fake/m1", input="My card ends in 4242.")
    stored = dict(fake.responses.stored)
    for call in (lambda: bob.responses.retrieve(made.id), lambda: bob.responses.input_items.list(made.id),
                 lambda: bob.responses.delete(made.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert fake.responses.stored == stored  # nothing was read or deleted for him
    assert alice.responses.retrieve(made.id).output_text == made.output_text
    assert [item.content for item in alice.responses.input_items.list(made.id)] == ["My card ends in 4242."]
    alice.responses.delete(made.id)
    assert made.id not in fake.responses.stored


def test_a_background_response_is_polled_by_its_tenant_alone(upstream, claude, gateway, redis_url):
    gw = start(gateway, upstream, claude, redis_url)
    alice, bob = openai_as(gw, "alice"), openai_as(gw, "bob")
    queued = alice.responses.create(model="fake/m1", input="A long report, please.", background=True)
    assert queued.status == "queued"
    assert alice.responses.retrieve(queued.id).id == queued.id  # recorded though it was no finished answer
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(queued.id)


def test_ids_a_tenant_never_saw_are_refused_like_ids_no_one_made(upstream, claude, gateway, redis_url):
    gw = start(gateway, upstream, claude, redis_url)
    bob = openai_as(gw, "bob")
    made = openai_as(gw, "alice").responses.create(model="fake/m1", input="Hi.")
    errors = []
    for named in (made.id, "resp_never_made"):
        with pytest.raises(openai.NotFoundError) as caught:
            bob.responses.retrieve(named)
        errors.append(caught.value.body)
    assert errors[0] == {**errors[1], "message": errors[0]["message"]}  # no probing whose an id is
    assert errors[0]["message"].replace(made.id, "X") == errors[1]["message"].replace("resp_never_made", "X")
