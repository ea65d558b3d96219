"""Requests shaped like Claude Code's and Codex's, through the official anthropic and openai
clients, the gateway and the nondeterministic fakes: validation no stricter than the
provider, client bookkeeping forwarded but not keyed, tool outputs sent byte for byte."""
from __future__ import annotations

import anthropic
import openai

from agent_bodies import DATA, TODAY, claude_request, claude_run, codex_request, codex_run
from claude_http import sdk, upstreams
from gw_http import client


def _claude(api: anthropic.Anthropic, headers: dict, **request):
    """(x-detgate-cache, x-detgate-key, the text streamed) of one streamed Claude Code turn."""
    raw = api.beta.messages.with_raw_response.create(**request, stream=True, extra_headers=headers)
    text = "".join(event.delta.text for event in raw.parse()
                   if event.type == "content_block_delta" and event.delta.type == "text_delta")
    return raw.headers["x-detgate-cache"], raw.headers["x-detgate-key"], text


def test_a_system_message_under_its_beta_is_forwarded_and_keyed_as_sent(upstream, claude, gateway):
    fake, _ = claude
    api = sdk(gateway(upstreams=upstreams(upstream, claude)).url)
    headers, session = claude_run()
    request = claude_request(TODAY, session)
    cache, key, text = _claude(api, headers, **request)
    assert cache == "miss" and text
    sent = fake.calls[0][1]
    assert fake.calls[0][0] == "/v1/messages" and sent["messages"][1] == request["messages"][1]
    assert sent["context_management"] == request["extra_body"]["context_management"]
    assert "mid-conversation-system-2026-04-07" in fake.headers[0]["anthropic-beta"]
    # Keyed as sent: the same turn without the system message is another question.
    without = {**request, "messages": request["messages"][:1]}
    assert _claude(api, headers, **without)[1] != key


def test_a_provider_refusal_of_an_unknown_role_is_passed_on_in_its_words(upstream, claude, gateway):
    fake, _ = claude
    api = sdk(gateway(upstreams=upstreams(upstream, claude)).url)
    headers, session = claude_run()
    request = {**claude_request(TODAY, session), "betas": ["claude-code-20250219"]}
    for _ in range(2):  # never stored: the second is refused upstream again
        try:
            api.beta.messages.create(**request, stream=True, extra_headers=headers)
        except anthropic.BadRequestError as exc:
            assert exc.body["error"]["message"] == "messages.1.role: Input should be 'user' or 'assistant'"
        else:
            raise AssertionError("the provider's 400 did not reach the client")
    assert len(fake.calls) == 2


def test_a_second_claude_code_run_hits_whatever_its_session_ids(upstream, claude, gateway):
    fake, _ = claude
    api = sdk(gateway(upstreams=upstreams(upstream, claude)).url)
    first_headers, first_session = claude_run()
    again_headers, again_session = claude_run()
    first = _claude(api, first_headers, **claude_request(TODAY, first_session, DATA))
    again = _claude(api, again_headers, **claude_request(TODAY, again_session, DATA))
    assert (first[0], again[0]) == ("miss", "hit") and first[1:] == again[1:]
    assert len(fake.calls) == 1


def test_a_file_read_by_claude_code_reaches_the_upstream_byte_for_byte(upstream, claude, gateway):
    fake, _ = claude
    api = sdk(gateway(upstreams=upstreams(upstream, claude)).url)
    headers, session = claude_run()
    clean = DATA.replace("\ufeff", "").replace("\u200b", "").replace("\r\n", "\n").replace("e\u0301", "\u00e9")
    dirty = _claude(api, headers, **claude_request(TODAY, session, DATA))
    result = fake.calls[0][1]["messages"][3]["content"][0]
    assert result["content"] == DATA and result["content"].encode() == DATA.encode()
    # Keyed as sent too: the file with other bytes is another question, answered upstream.
    cleaned = _claude(api, headers, **claude_request(TODAY, session, clean))
    assert cleaned[0] == "miss" and cleaned[1] != dirty[1]
    assert fake.calls[1][1]["messages"][3]["content"][0]["content"] == clean
    # The app's own prompt text still gets the text rules.
    assert fake.calls[0][1]["messages"][0]["content"][1]["text"] == "Read data.txt."


def _codex(api: openai.OpenAI, **request) -> tuple[str, str, str]:
    """(x-detgate-cache, x-detgate-key, the output text) of one streamed Codex turn."""
    raw = api.responses.with_raw_response.create(**request, stream=True)
    text = "".join(event.delta for event in raw.parse() if event.type == "response.output_text.delta")
    return raw.headers["x-detgate-cache"], raw.headers["x-detgate-key"], text


def test_codex_bookkeeping_is_forwarded_but_not_keyed(upstream, gateway):
    fake, _ = upstream
    api = client(gateway().url)
    first_run, second_run = codex_run(), codex_run()
    first = codex_request(TODAY, first_run, output=DATA)
    second = codex_request(TODAY, second_run, output=DATA)
    assert first["input"][1]["id"] != second["input"][1]["id"]
    replies = [_codex(api, **first), _codex(api, **second)]
    assert [r[0] for r in replies] == ["miss", "hit"] and replies[0][1:] == replies[1][1:]
    assert len(fake.calls) == 1
    sent = fake.calls[0][1]
    assert sent["client_metadata"] == first["extra_body"]["client_metadata"]
    assert sent["prompt_cache_key"] == first_run["session"]
    assert [item.get("id") for item in sent["input"]] == [item.get("id") for item in first["input"]]
    # What pairs a call with its output is keyed: another call id is another conversation.
    paired = codex_request(TODAY, second_run, output=DATA)
    for item in paired["input"][-2:]:
        item["call_id"] = "call_other"
    assert _codex(api, **paired)[0] == "miss"


def test_a_file_read_by_codex_reaches_the_upstream_byte_for_byte(upstream, gateway):
    fake, _ = upstream
    api = client(gateway().url)
    request = codex_request(TODAY, codex_run(), output=DATA)
    _codex(api, **request)
    assert fake.calls[0][1]["input"][-1]["output"][1]["text"] == DATA
    # A function tool's output the same, whole answer or stream.
    function_call = {"type": "function_call", "call_id": "call_1", "name": "read", "arguments": '{"path":"data.txt"}'}
    output = {"type": "function_call_output", "call_id": "call_1", "output": DATA}
    api.responses.create(model="fake/m1", input=[{"role": "user", "content": "Read data.txt."}, function_call, output])
    assert fake.calls[1][1]["input"][2]["output"] == DATA


def test_a_chat_tool_message_reaches_the_upstream_byte_for_byte(upstream, gateway):
    fake, _ = upstream
    api = client(gateway().url)
    call = {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    api.chat.completions.create(model="fake/m1", messages=[
        {"role": "user", "content": "Read data.txt.\r\n"}, {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": DATA}])
    sent = fake.calls[0][1]["messages"]
    assert sent[2]["content"] == DATA and sent[0]["content"] == "Read data.txt.\n"
