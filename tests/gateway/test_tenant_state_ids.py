"""Ids that name upstream state (a conversation, an item reference, a file, an Anthropic
container) act only for the tenant that was served or made them: another tenant gets the
wire's 404 and the operator's key never carries its request, even where the two share
cache entries (issue 44)."""
from __future__ import annotations

import anthropic
import openai
import pytest

from tenant_pair import anthropic_as, openai_as, start

MODEL = "claude-sonnet-4-6"
CODE = [{"type": "code_execution_20250825", "name": "code_execution"}]


def test_a_conversation_is_its_makers(upstream, claude, gateway, redis_url):
    fake, _ = upstream
    gw = start(gateway, upstream, claude, redis_url)
    alice, bob = openai_as(gw, "alice"), openai_as(gw, "bob")
    conversation = alice.conversations.create()
    told = alice.responses.create(model="fake/m1", input="My secret is 42.", conversation=conversation.id)
    assert told.conversation.id == conversation.id
    calls = len(fake.calls)
    with pytest.raises(openai.NotFoundError) as caught:
        bob.responses.create(model="fake/m1", input="What was my secret?", conversation=conversation.id)
    assert caught.value.param == "conversation" and len(fake.calls) == calls
    with pytest.raises(openai.NotFoundError):
        bob.responses.create(model="fake/m1", input="And now?", conversation={"id": conversation.id})
    assert alice.responses.create(model="fake/m1", input="What was it?", conversation=conversation.id).output_text
    assert len(fake.calls) == calls + 1


def test_an_item_reference_is_the_served_tenants_even_from_a_shared_entry(upstream, claude, gateway, redis_url):
    fake, _ = upstream
    gw = start(gateway, upstream, claude, redis_url, shared_cache_tenants=["alice", "bob"])
    alice, bob = openai_as(gw, "alice"), openai_as(gw, "bob")
    item = alice.responses.create(model="fake/m1", input="Remember: the vault code is 7311.").output[0].id
    asked = [{"type": "item_reference", "id": item}, {"role": "user", "content": "Repeat that."}]
    mine = alice.responses.with_raw_response.create(model="fake/m1", input=asked)
    assert mine.headers["x-detgate-cache"] == "miss"
    calls = len(fake.calls)
    with pytest.raises(openai.NotFoundError) as caught:  # a hit would tell him as much as the upstream
        bob.responses.create(model="fake/m1", input=asked)
    assert caught.value.param == "input[0].id" and len(fake.calls) == calls
    again = alice.responses.with_raw_response.create(model="fake/m1", input=asked)
    assert again.headers["x-detgate-cache"] == "hit" and again.http_response.content == mine.http_response.content


def test_a_file_no_one_was_served_is_refused(upstream, claude, gateway, redis_url):
    fake, _ = upstream
    gw = start(gateway, upstream, claude, redis_url)
    asked = [{"role": "user", "content": [{"type": "input_text", "text": "Summarize."},
                                          {"type": "input_file", "file_id": "file-alices-payslip"}]}]
    with pytest.raises(openai.NotFoundError) as caught:
        openai_as(gw, "bob").responses.create(model="fake/m1", input=asked)
    assert caught.value.param == "input[0].content[1].file_id" and fake.calls == []


def test_a_container_is_the_tenant_it_was_served_to(upstream, claude, gateway, redis_url):
    fake, _ = claude
    gw = start(gateway, upstream, claude, redis_url)
    alice, bob = anthropic_as(gw, "alice"), anthropic_as(gw, "bob")
    made = alice.messages.create(model=MODEL, max_tokens=64, tools=CODE,
                                 messages=[{"role": "user", "content": "Write my notes to notes.txt."}])
    container = made.container.id
    ask = {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "Read notes.txt."}]}
    assert alice.messages.create(**ask, extra_body={"container": container}).container.id == container
    calls = len(fake.calls)
    with pytest.raises(anthropic.NotFoundError) as caught:
        bob.messages.create(**ask, extra_body={"container": container})
    assert caught.value.body["error"]["type"] == "not_found_error" and len(fake.calls) == calls
