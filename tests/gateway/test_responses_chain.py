"""Stateful Responses requests: a `previous_response_id` chain is keyed on the turns before
it and replays from the cache with no upstream (`--mode replay`); what the gateway cannot
key (an id it did not serve, a conversation, a background job) is passed through
uncached and says why; and one tenant cannot continue another's answers."""
from __future__ import annotations

import time

import openai
import orjson
import pytest

from gw_http import SECRET, client, post, serve_args
from test_cache_io import cli, flush

TURNS = ("Pick a number.", "Double it.", "Now name it in French.")


def converse(api: openai.OpenAI, model: str = "fake/m1", **extra) -> list:
    """Three turns, each continuing the answer before it; the raw replies."""
    replies, previous = [], None
    for text in TURNS:
        reply = api.responses.with_raw_response.create(model=model, input=text, previous_response_id=previous, **extra)
        previous = reply.parse().id
        replies.append(reply)
    return replies


def test_a_three_turn_chain_replays_with_no_upstream_call(upstream, gateway, redis_url):
    fake, _ = upstream
    shared = {"redis_url": redis_url, "near_cache_ttl_s": 0}
    normal, replay = gateway(**shared), gateway(mode="replay", **shared)
    recorded = converse(client(normal.url))
    assert [r.headers["x-detgate-cache"] for r in recorded] == ["miss"] * 3
    sent = [body.get("previous_response_id") for _, body in fake.calls]
    assert sent == [None, recorded[0].parse().id, recorded[1].parse().id]  # the upstream keeps the state

    calls = len(fake.calls)
    replayed = converse(client(replay.url))
    assert len(fake.calls) == calls
    assert [r.headers["x-detgate-cache"] for r in replayed] == ["hit"] * 3
    assert [r.http_response.content for r in replayed] == [r.http_response.content for r in recorded]
    assert [r.headers["x-detgate-key"] for r in replayed] == [r.headers["x-detgate-key"] for r in recorded]


def test_a_turn_is_keyed_on_the_turns_before_it(upstream, gateway):
    fake, _ = upstream
    api = client(gateway().url)
    first, second = converse(api)[:2]
    alone = api.responses.with_raw_response.create(model="fake/m1", input=TURNS[1])
    # The same words, once after turn one and once on their own: two questions, two keys.
    assert alone.headers["x-detgate-cache"] == "miss"
    assert alone.headers["x-detgate-key"] != second.headers["x-detgate-key"]
    again = api.responses.with_raw_response.create(model="fake/m1", input=TURNS[1],
                                                   previous_response_id=first.parse().id)
    assert again.headers["x-detgate-cache"] == "hit" and again.http_response.content == second.http_response.content


def test_streamed_turns_chain_as_bodies_do(upstream, gateway):
    fake, _ = upstream
    api = client(gateway().url)
    previous = None
    for text in TURNS:
        with api.responses.stream(model="fake/m1", input=text, previous_response_id=previous) as stream:
            previous = stream.get_final_response().id
    calls = len(fake.calls)
    replayed = converse(api)
    assert [r.headers["x-detgate-cache"] for r in replayed] == ["hit"] * 3 and len(fake.calls) == calls
    assert replayed[-1].parse().id == previous


def test_an_id_the_gateway_did_not_serve_is_passed_through_with_a_warning(upstream, gateway):
    fake, base = upstream
    made_elsewhere = openai.OpenAI(base_url=base, api_key="unused").responses.create(model="m1", input="Hi.").id
    gw = gateway()
    body = {"model": "fake/m1", "input": "And then?", "previous_response_id": made_elsewhere}
    replies = [post(gw.url, "/v1/responses", body) for _ in range(2)]
    assert [r.cache for r in replies] == ["bypass", "bypass"] and replies[0].body != replies[1].body
    assert "did not serve" in replies[0].headers["x-detgate-warnings"]
    assert [b["previous_response_id"] for _, b in fake.calls[1:]] == [made_elsewhere] * 2
    gone = post(gw.url, "/v1/responses", {**body, "previous_response_id": "resp_never_made"})
    assert gone.status == 404 and gone.json()["error"]["code"] == "previous_response_not_found"  # the upstream's own


@pytest.mark.parametrize("extra, why", [({"conversation": "conv_123"}, "conversation"),
                                        ({"background": True}, "background"),
                                        ({"prompt": {"id": "pmpt_1"}}, "pin a version")])
def test_state_the_gateway_cannot_key_is_passed_through(upstream, gateway, extra, why):
    fake, _ = upstream
    gw = gateway()
    body = {"model": "fake/m1", "input": "Go on.", **extra}
    replies = [post(gw.url, "/v1/responses", body) for _ in range(2)]
    assert [r.cache for r in replies] == ["bypass"] * 2 and len(fake.calls) == 2
    assert why in replies[0].headers["x-detgate-warnings"]
    if "background" in extra:
        assert replies[0].status == 200 and replies[0].json()["status"] == "queued"  # passed on as it came
    replay = gateway(mode="replay")
    refused = post(replay.url, "/v1/responses", body)
    assert refused.status == 400 and refused.json()["error"]["code"] == "replay_miss" and len(fake.calls) == 2


def test_tenants_continue_only_their_own_answers(upstream, gateway):
    fake, _ = upstream
    gw = gateway(tenants={"alice": {"key": "key-alice"}, "bob": {"key": "key-bob"}})
    alice = openai.OpenAI(base_url=gw.url + "/v1", api_key="key-alice", max_retries=0)
    bob = openai.OpenAI(base_url=gw.url + "/v1", api_key="key-bob", max_retries=0)
    hers = alice.responses.create(model="fake/m1", input="My secret is 42.").id
    calls = len(fake.calls)
    with pytest.raises(openai.NotFoundError) as caught:
        bob.responses.create(model="fake/m1", input="What was my secret?", previous_response_id=hers)
    assert caught.value.code == "previous_response_not_found" and caught.value.param == "previous_response_id"
    assert len(fake.calls) == calls  # the operator's key never continued her conversation for him
    mine = alice.responses.with_raw_response.create(model="fake/m1", input="What was it?", previous_response_id=hers)
    assert mine.headers["x-detgate-cache"] == "miss" and len(fake.calls) == calls + 1


def test_a_chain_travels_through_export_and_import(upstream, redis_url, gateway_process, tmp_path):
    """Recorded by `detgate serve`, exported, the store flushed, imported, replayed by
    another `detgate serve --mode replay`: each answer with the link that lets the next
    turn find it."""
    fake, url = upstream
    recorder = gateway_process(serve_args(url, redis_url))
    recorded = converse(client(recorder.url))
    recorder.stop()
    golden = tmp_path / "golden.jsonl"
    assert cli("cache", "export", str(golden), "--redis-url", redis_url, "--secret", SECRET).returncode == 0
    records = [orjson.loads(line)["entry"] for line in golden.read_bytes().splitlines()]
    # Three answers, and for each its own id and its output message's (gateway/cache/owners.py).
    assert sorted(r["finish"] for r in records) == ["link"] * 6 + ["stop"] * 3
    flush(redis_url)
    assert cli("cache", "import", str(golden), "--redis-url", redis_url, "--secret", SECRET).returncode == 0

    calls = len(fake.calls)
    replay = gateway_process(serve_args(url, redis_url, "--mode", "replay"))
    replayed = converse(client(replay.url))
    assert [r.http_response.content for r in replayed] == [r.http_response.content for r in recorded]
    assert len(fake.calls) == calls


def test_a_request_passed_through_is_sent_once_whatever_the_strategy(upstream, gateway):
    fake, _ = upstream
    reply = post(gateway().url, "/v1/responses", {"model": "fake/m1", "input": "Go on.", "conversation": "conv_1"},
                 {"x-detgate-vote": "3"})
    assert reply.cache == "bypass" and len(fake.calls) == 1  # three votes would add three turns to the conversation
    assert "sent once" in reply.headers["x-detgate-warnings"] and "x-detgate-votes" not in reply.headers


def test_stored_responses_are_read_and_deleted_only_where_the_proxy_allows(upstream, gateway):
    fake, base = upstream
    closed = client(gateway().url)
    made = closed.responses.create(model="fake/m1", input="Keep this.")
    with pytest.raises(openai.PermissionDeniedError) as caught:
        closed.responses.retrieve(made.id)
    assert caught.value.code == "path_not_allowed"
    rules = ["GET /responses/{id}", "DELETE /responses/{id}"]
    opened = client(gateway(upstreams=[{"name": "fake", "url": base, "proxy": rules}]).url)
    assert opened.responses.retrieve(made.id).output_text == made.output_text
    opened.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        opened.responses.retrieve(made.id)


def test_a_link_ages_out_with_the_answer_it_points_at(upstream, gateway):
    fake, _ = upstream
    api = client(gateway(ttl_s=0.5).url)
    first = api.responses.create(model="fake/m1", input=TURNS[0])
    time.sleep(0.6)
    later = api.responses.with_raw_response.create(model="fake/m1", input=TURNS[1], previous_response_id=first.id)
    assert later.headers["x-detgate-cache"] == "bypass" and "no longer remembers" in later.headers["x-detgate-warnings"]
