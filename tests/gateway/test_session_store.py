"""Recorded sessions hold the same contract on each store the gateway runs on: the
in-process one, a real Redis and a real 3-master Redis Cluster (whose scripts only run
when every key they touch shares a slot). A turn is found again by its masked key only
by its own tenant and only for the request it was recorded for; a turn that fails its
MAC is never used; an imported session replaces the stored one whole."""
from __future__ import annotations

import pytest

from gateway.cache.recordings import Asking, Recordings
from gateway.cache.redis_store import RedisStore
from gateway.cache.session_store import MemorySessions, RedisSessions
from gateway.cache.sessions import masked, session_name, session_tag, tenant_tag, tool_outputs
from gateway.policy.canonical import canonical_json
from gateway.policy.json_diff import ABSENT, Difference, shortened
from gateway.policy.keys import KeyParts, sign

SECRET = b"session-store-secret"


def conversation(*outputs: str, prompt: str = "List the files.") -> dict:
    messages = [{"content": prompt, "role": "user"}]
    for i, output in enumerate(outputs):
        messages += [{"content": [{"id": f"toolu_{i}", "input": {}, "name": "shell", "type": "tool_use"}],
                      "role": "assistant"},
                     {"content": [{"content": output, "tool_use_id": f"toolu_{i}", "type": "tool_result"}],
                      "role": "user"}]
    return {"max_tokens": 64, "messages": messages, "model": "claude-x"}


def asking(doc: dict, session: str = "run-1", tenant: str = "alpha", model: str = "claude-x") -> Asking:
    parts = KeyParts(tenant, "claude", model, "messages", "single", canonical_json(doc))
    return Asking(parts, session, "claude", model, "")


def key_of(request: Asking) -> str:
    return sign(SECRET, request.parts)


@pytest.fixture(params=["memory", "redis", "cluster"])
async def recordings(request, redis_url):
    if request.param == "memory":
        yield Recordings(MemorySessions(1 << 20), SECRET, lambda key, upstream, model: key)
        return
    url = redis_url if request.param == "redis" else f"redis+cluster://127.0.0.1:{request.getfixturevalue('cluster').ports[0]}"
    store = RedisStore(url)
    if request.param == "cluster":
        await store.client.flushall()
    yield Recordings(RedisSessions(store.client), SECRET, lambda key, upstream, model: key)
    await store.close()


async def test_a_turn_is_found_by_its_tool_outputs_masked_and_kept_once(recordings):
    first, second = asking(conversation("a")), asking(conversation("a", "b"))
    for request in (first, second):
        assert await recordings.record(request, key_of(request))
    assert not await recordings.record(second, key_of(second))  # already a turn of this session
    replayed = asking(conversation("A", "B"), session="run-2")
    turn, changed = await recordings.same_but_tool_outputs(replayed)
    assert (turn.n, turn.key, turn.session) == (1, key_of(second), "run-1")
    assert changed == ["messages[2].content[0].content", "messages[4].content[0].content"]
    assert await recordings.same_but_tool_outputs(asking(conversation("A", "B", prompt="Other."))) is None

    tenant = tenant_tag(SECRET, "alpha")
    assert [t async for t in recordings.store.tenants()] == [tenant]
    assert await recordings.store.sessions(tenant) == {session_tag(SECRET, tenant, "run-1"): "run-1"}


async def test_of_two_recordings_the_one_whose_outputs_are_nearer_answers(recordings):
    """Two workspaces, one prompt: the agent listed other files in each. A replay whose
    listing differs from the first only in its timestamps is the first, though recorded earlier."""
    for session, listing in (("ws-a", "a.txt b.txt 13:56"), ("ws-b", "c.txt d.txt 13:57")):
        request = asking(conversation(listing), session=session)
        await recordings.record(request, key_of(request))
    turn, changed = await recordings.same_but_tool_outputs(asking(conversation("a.txt b.txt 09:12"), session="ci"))
    assert (turn.session, changed) == ("ws-a", ["messages[2].content[0].content"])


async def test_a_replay_run_keeps_to_the_recorded_session_it_follows(recordings):
    for session, listing in (("ws-a", "a.txt 13:56"), ("ws-b", "b.txt 13:57")):
        for doc in (conversation(listing), conversation(listing, "x")):
            request = asking(doc, session=session)
            await recordings.record(request, key_of(request))
    turn, _ = await recordings.same_but_tool_outputs(asking(conversation("a.txt 09:12"), session="ci"))
    assert turn.session == "ws-a"  # its listing is nearer: the run "ci" follows ws-a from here on
    # Outputs nearer ws-b's: a run that follows ws-a keeps to it, another run goes by the words.
    turn, _ = await recordings.same_but_tool_outputs(asking(conversation("b.txt 09:12", "y"), session="ci"))
    assert (turn.session, turn.n) == ("ws-a", 1)
    turn, _ = await recordings.same_but_tool_outputs(asking(conversation("b.txt 09:12", "y"), session="other"))
    assert (turn.session, turn.n) == ("ws-b", 1)
    found = await recordings.nearest(asking(conversation("a.txt", "y", prompt="Other."), session="ci"))
    assert (found.turn.session, found.where) == ("ws-a", "followed")
    assert found.place() == 'the recorded session this run follows ("ws-a")'


async def test_a_turn_serves_only_its_own_tenant_and_request(recordings):
    request = asking(conversation("a"))
    await recordings.record(request, key_of(request))
    assert await recordings.same_but_tool_outputs(asking(conversation("b"), tenant="beta")) is None
    assert await recordings.nearest(asking(conversation("b"), tenant="beta")) is None
    # The same masked form for another model: recorded under another key, so not this request's.
    assert await recordings.same_but_tool_outputs(asking(conversation("b"), model="claude-y")) is None
    # Once a drift rotation moved the model's keys to a new namespace, its turns stay behind.
    rotated = Recordings(recordings.store, SECRET, lambda key, upstream, model: key + "@2")
    assert await rotated.same_but_tool_outputs(asking(conversation("b"))) is None
    assert (await recordings.same_but_tool_outputs(asking(conversation("b"))))[1] == ["messages[2].content[0].content"]


async def test_nearest_prefers_the_requests_own_session(recordings):
    for session, prompt in (("run-1", "List the files."), ("run-2", "List the fils.")):
        for doc in (conversation(prompt=prompt), conversation("a", prompt=prompt)):
            request = asking(doc, session=session)
            await recordings.record(request, key_of(request))
    sent = conversation("a", "b", prompt="List the files.")
    found = await recordings.nearest(asking(sent, session="run-2"))
    assert (found.turn.session, found.turn.n, found.where) == ("run-2", 1, "own")
    found = await recordings.nearest(asking(sent, session="run-3"))
    assert (found.turn.session, found.turn.n, found.where) == ("run-1", 1, "other")


async def test_an_imported_session_replaces_the_stored_one_and_a_forged_turn_is_ignored(recordings):
    store, tenant = recordings.store, tenant_tag(SECRET, "alpha")
    session = session_tag(SECRET, tenant, "run-1")
    for doc in (conversation("a"), conversation("a", "b")):
        await recordings.record(asking(doc), key_of(asking(doc)))
    kept = key_of(asking(conversation("a")))
    value = await store.turn(tenant, session, kept)
    indexed = await store.candidates(tenant, recordings.masked_key(
        asking(conversation("a")), masked("messages", canonical_json(conversation("a")))))
    assert indexed == [(session, kept)]
    await store.put(tenant, session, "run-1", [(kept, value, None)])
    assert list(await store.turns(tenant, session)) == [kept] and await store.count(tenant, session) == 1

    await store.put(tenant, session, "run-1", [(kept, b"0" * 64 + value[64:], None)])  # its MAC forged
    assert await recordings.same_but_tool_outputs(asking(conversation("z"))) is None
    assert await recordings.nearest(asking(conversation("z"))) is None


def test_tool_outputs_on_each_wire_and_the_session_a_request_names():
    responses = {"input": [{"content": "hi", "role": "user", "type": "message"},
                           {"call_id": "c", "input": "ls", "name": "exec", "type": "custom_tool_call"},
                           {"call_id": "c", "output": "a.txt", "type": "custom_tool_call_output"},
                           {"call_id": "d", "output": [{"text": "b", "type": "input_text"}], "type": "function_call_output"}]}
    assert [p for p, _, _ in tool_outputs("responses", responses)] == ["input[2].output", "input[3].output"]
    chat = {"messages": [{"content": "x", "role": "user"}, {"content": "y", "role": "tool", "tool_call_id": "c"}]}
    assert [p for p, _, _ in tool_outputs("chat.completions", chat)] == ["messages[1].content"]
    errored = {"messages": [{"content": [{"content": "no", "is_error": True, "tool_use_id": "t", "type": "tool_result"}],
                             "role": "user"}]}
    assert [p for p, _, _ in tool_outputs("messages", errored)] == ["messages[0].content[0].content",
                                                                    "messages[0].content[0].is_error"]
    assert masked("messages", canonical_json({"messages": [{"content": "x", "role": "user"}]})) is None

    codex = {"client_metadata": {"session_id": "from-body"}}
    assert session_name({"session-id": "codex", "x-detgate-session": "mine"}, codex) == "mine"
    assert session_name({"session-id": "codex"}, codex) == "codex"
    assert session_name({}, codex) == "from-body" and session_name({}, {}) == ""


def test_a_long_text_is_shortened_around_where_it_first_differs():
    recorded = "Rules. " * 2000 + "Today's date is 2026-11-28." + " More." * 500
    sent = recorded.replace("2026-11-28", "2026-11-29")
    before, after = shortened(Difference("system[0].text", recorded, sent))
    assert '2026-11-28' in before and '2026-11-29' in after and before.startswith('..."')
    assert before.endswith(f"({len(recorded)} characters, from character 14005)")
    assert shortened(Difference("model", "a", ABSENT)) == ('"a"', "(absent)")
