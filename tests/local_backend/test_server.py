"""The real server, over loopback HTTP, through the official openai client."""
from __future__ import annotations

import asyncio
import time

import aiohttp
import openai
import pytest
import torch

import kernels

from conftest import Server, make_engine, metric
from local_backend.engine.outbox import STALL_SECONDS
from local_backend.tokenizer import Tokenizer
from reference import ReferenceModel

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there, how are you?"}]


async def test_models_lists_the_served_model(server):
    models = await server.client.models.list()
    assert [m.id for m in models.data] == [server.name]


async def test_chat_template_is_rendered_with_bos_and_generation_prompt(server, checkpoints):
    tok = Tokenizer(checkpoints[server.name])
    expected = {
        "llama": "<|begin_of_text|><|start|>system\nBe brief.<|end|><|start|>user\nhello there, how are you?<|end|>"
                 "<|start|>assistant\n",
        "qwen2": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhello there, how are you?<|im_end|>\n"
                 "<|im_start|>assistant\n",
    }.get(server.name, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhello there, how are you?"
                       "<|im_end|>\n<|im_start|>assistant\n")
    assert tok.render_chat(CHAT) == expected
    r = await server.client.chat.completions.create(model=server.name, messages=CHAT, max_tokens=3, temperature=0)
    assert r.usage.prompt_tokens == len(tok.encode(expected, add_special_tokens=False))
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"


async def test_template_raise_exception_is_a_400(engines):
    async with Server(engines["llama"], "llama") as s:
        with pytest.raises(openai.BadRequestError, match="unknown role tool"):
            await s.client.chat.completions.create(
                model="llama", messages=[{"role": "tool", "content": "x"}], max_tokens=2)


async def test_greedy_is_argmax_of_the_reference_forward_pass(server, checkpoints):
    path = checkpoints[server.name]
    tok = Tokenizer(path)
    prompt = tok.encode("The quick brown fox", add_special_tokens=True)
    expected, ref_logprobs = ReferenceModel(path).greedy(prompt, 12)
    r = await server.client.completions.create(
        model=server.name, prompt=prompt, max_tokens=12, temperature=0, logprobs=3, extra_body={"ignore_eos": True})
    choice = r.choices[0]
    assert choice.text == tok.decode(expected)
    assert choice.logprobs.tokens == [tok.token_text(t) for t in expected]
    for lp, ref, top in zip(choice.logprobs.token_logprobs, ref_logprobs, choice.logprobs.top_logprobs):
        assert lp == pytest.approx(float(ref.max()), abs=1e-4)
        # Keyed by token text, so tokens that print alike (ids past the tokenizer) share a key.
        ref_top = torch.topk(ref, 3).values.tolist()
        assert all(any(abs(v - r) < 1e-4 for r in ref_top) for v in top.values())


async def test_streaming_equals_non_streaming(server):
    for params in ({"temperature": 0}, {"temperature": 0.9, "seed": 7, "top_p": 0.9, "extra_body": {"top_k": 50}},
                   {"temperature": 1.0, "seed": 3, "stop": ["e", "th"]}):
        full = await server.client.chat.completions.create(
            model=server.name, messages=CHAT, max_tokens=24, logprobs=True, top_logprobs=2, **params)
        chunks = [c async for c in await server.client.chat.completions.create(
            model=server.name, messages=CHAT, max_tokens=24, logprobs=True, top_logprobs=2, stream=True,
            stream_options={"include_usage": True}, **params)]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        streamed_logprobs = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
        assert text == full.choices[0].message.content
        assert [(e.token, e.logprob) for e in streamed_logprobs] == [(e.token, e.logprob) for e in full.choices[0].logprobs.content]
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == full.choices[0].finish_reason
        assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
        assert {c.system_fingerprint for c in chunks} == {full.system_fingerprint}


async def test_a_stream_that_fell_behind_catches_up_in_fewer_chunks(qwen3):
    """Tokens queued behind a busy event loop go out together, with the text and logprobs
    they would have had one chunk each; the engine, held at most STALL_SECONDS a step by a
    loop that does not read, still generates them."""
    body = dict(model="qwen3", prompt="Deterministic answers", max_tokens=16, temperature=0, logprobs=1,
                extra_body={"ignore_eos": True})
    full = await qwen3.client.completions.create(**body)

    def with_tokens(chunks):
        return [c for c in chunks if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.tokens]

    kept_up = with_tokens([c async for c in await qwen3.client.completions.create(stream=True, **body)])
    stream = await qwen3.client.completions.create(stream=True, **body)
    chunks = [await anext(stream)]
    time.sleep(16 * STALL_SECONDS + 0.5)   # holds the server's event loop (this one) while the engine generates
    chunks += [c async for c in stream]
    assert len(with_tokens(chunks)) < len(kept_up) / 2
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert [lp for c in with_tokens(chunks) for lp in c.choices[0].logprobs.token_logprobs] == \
        full.choices[0].logprobs.token_logprobs


async def test_a_failed_step_fails_its_requests_not_the_server(checkpoints, monkeypatch):
    """A step that raises ends its requests with OpenAI's 500 server_error, a stream after the
    tokens it already had, and the next request is served as before."""
    async with Server(make_engine(checkpoints["qwen3"]), "qwen3") as s:
        body = dict(model="qwen3", prompt="Deterministic answers", max_tokens=8, temperature=0,
                    extra_body={"ignore_eos": True})
        good = (await s.client.completions.create(**body)).choices[0].text
        launch, calls = s.engine.runner.launch, []

        def fails_fourth(scheduled, launched=lambda: None):
            calls.append(1)
            if len(calls) % 4 == 0:
                raise RuntimeError("device lost")
            return launch(scheduled, launched)

        monkeypatch.setattr(s.engine.runner, "launch", fails_fourth)
        received = []
        with pytest.raises(openai.APIError, match="inference step failed"):
            async for chunk in await s.client.completions.create(stream=True, **body):
                received.append(chunk.choices[0].text)
        assert good.startswith("".join(received))
        calls.clear()
        calls += [1, 1, 1]   # the next step fails
        with pytest.raises(openai.InternalServerError) as failed:
            await s.client.completions.create(**body)
        assert failed.value.body["type"] == "server_error"
        monkeypatch.setattr(s.engine.runner, "launch", launch)
        assert (await s.client.completions.create(**body)).choices[0].text == good


async def test_stop_string_across_token_boundaries_is_cut_and_not_returned(server):
    base = await server.client.completions.create(
        model=server.name, prompt="Deterministic answers", max_tokens=40, temperature=0, logprobs=0,
        extra_body={"ignore_eos": True})
    text = base.choices[0].text
    # Three clean characters from the middle: with tokens of one or two characters they
    # span a token boundary (test_text_stream.py pins that case down token by token).
    p = next(i for i in range(3, len(text) - 3)
             if "\ufffd" not in text[i:i + 3] and text.index(text[i:i + 3]) == i)
    stop = text[p:p + 3]
    used = set()
    for stream in (False, True):
        r = await server.client.completions.create(
            model=server.name, prompt="Deterministic answers", max_tokens=40, temperature=0, stop=[stop, "\x00never"],
            stream=stream, stream_options={"include_usage": True} if stream else None, extra_body={"ignore_eos": True})
        if stream:
            chunks = [c async for c in r]
            got, reason = "".join(c.choices[0].text for c in chunks if c.choices), chunks[-2].choices[0].finish_reason
            used.add(chunks[-1].usage.completion_tokens)
        else:
            got, reason = r.choices[0].text, r.choices[0].finish_reason
            used.add(r.usage.completion_tokens)   # the tokens up to the stop, though read 16 at a time
        assert got == text[:text.index(stop)]
        assert reason == "stop"
    assert len(used) == 1 and used.pop() < 40


async def test_logprobs_are_consistent(qwen3):
    r = await qwen3.client.chat.completions.create(
        model="qwen3", messages=CHAT, max_tokens=10, temperature=0.8, seed=11, logprobs=True, top_logprobs=5)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 10
    for e in content:
        tops = [t.logprob for t in e.top_logprobs]
        assert len(tops) == 5 and tops == sorted(tops, reverse=True)
        assert e.logprob <= tops[0] + 1e-6 and e.logprob <= 0
        assert sum(torch.tensor(tops).exp()) <= 1 + 1e-5
    greedy = await qwen3.client.chat.completions.create(
        model="qwen3", messages=CHAT, max_tokens=10, temperature=0, logprobs=True, top_logprobs=1)
    for e in greedy.choices[0].logprobs.content:
        assert e.logprob == e.top_logprobs[0].logprob


async def test_seed_is_reported_and_replays(server):
    kwargs = dict(model=server.name, messages=CHAT, max_tokens=16, temperature=1.0)
    raw = await server.client.chat.completions.with_raw_response.create(**kwargs)
    first = raw.parse()
    seed = first.model_extra["seed"]
    assert raw.headers["x-detgate-seed"] == str(seed)
    again = await server.client.chat.completions.create(seed=seed, **kwargs)
    assert again.model_extra["seed"] == seed
    assert again.choices[0].message.content == first.choices[0].message.content
    texts = {(await server.client.chat.completions.create(seed=s, **kwargs)).choices[0].message.content
             for s in (1, 2, 3, 4)}
    assert len(texts) > 1   # the seed reaches the sampler


async def test_completions_accepts_text_and_token_prompts(qwen3, checkpoints):
    tok = Tokenizer(checkpoints["qwen3"])
    by_text = await qwen3.client.completions.create(model="qwen3", prompt="hello there", max_tokens=8, temperature=0)
    by_ids = await qwen3.client.completions.create(
        model="qwen3", prompt=tok.encode("hello there", add_special_tokens=True), max_tokens=8, temperature=0)
    assert by_text.choices[0].text == by_ids.choices[0].text
    assert by_text.usage.prompt_tokens == by_ids.usage.prompt_tokens


BAD = [
    ("/v1/chat/completions", b"{not json", 400, None),
    ("/v1/chat/completions", b"[1, 2]", 400, None),
    ("/v1/chat/completions", b'{"model": "qwen3"}', 400, "messages"),
    ("/v1/chat/completions", b'{"model": "qwen3", "messages": []}', 400, "messages"),
    ("/v1/chat/completions", b'{"model": "qwen3", "messages": [{"role": "user", "content": "hi"}], "n": 2}', 400, "n"),
    ("/v1/chat/completions", b'{"model": "qwen3", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}', 400, "temperature"),
    ("/v1/chat/completions", b'{"model": "qwen3", "messages": [{"role": "user", "content": "hi"}], "temperature": 3}', 400, "temperature"),
    ("/v1/chat/completions", b'{"model": "qwen3", "messages": [{"role": "user", "content": "hi"}], "seed": 99999999999999999999}', 400, "seed"),
    ("/v1/chat/completions", b'{"model": "qwen3", "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}', 400, "top_logprobs"),
    ("/v1/chat/completions", b'{"model": "qwen3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}', 400, "max_tokens"),
    ("/v1/chat/completions", b'{"model": "qwen3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}', 400, "messages"),
    ("/v1/chat/completions", b'{"model": "qwen3", "messages": [{"role": "wizard", "content": "hi"}]}', 400, "messages.0.role"),
    ("/v1/chat/completions", b'{"model": "qwen3", "messages": [{"role": "user", "content": "hi"}], "stop": [""]}', 400, "stop"),
    ("/v1/chat/completions", b'{"model": "qwen3", "messages": [{"role": "user", "content": "hi"}], "logit_bias": {"1": 5}}', 400, "logit_bias"),
    ("/v1/chat/completions", b'{"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}', 404, "model"),
    ("/v1/completions", b'{"model": "qwen3", "prompt": [1, -5]}', 400, "prompt"),
    ("/v1/completions", b'{"model": "qwen3", "prompt": ["a", "b"]}', 400, "prompt"),
    ("/v1/completions", b'{"model": "qwen3", "prompt": "hi", "suffix": "!"}', 400, "suffix"),
    ("/v1/completions", b'{"model": "qwen3", "prompt": "hi", "max_tokens": 0}', 400, "max_tokens"),
    ("/v1/completions", b'{"model": "qwen3", "prompt": "hi", "prompt_logprobs": 21}', 400, "prompt_logprobs"),
    ("/v1/nowhere", b"{}", 404, None),
]


@pytest.mark.parametrize("path,body,status,param", BAD)
async def test_bad_input_gets_an_openai_error(qwen3, path, body, status, param):
    async with aiohttp.ClientSession() as http:
        async with http.post(qwen3.url + path, data=body, headers={"Content-Type": "application/json"}) as r:
            assert r.status == status
            err = (await r.json())["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param
    # The server still serves after every rejection.
    ok = await qwen3.client.completions.create(model="qwen3", prompt="hi", max_tokens=2)
    assert ok.choices[0].finish_reason in ("length", "stop")


async def test_openai_client_sees_bad_requests_as_400(qwen3):
    with pytest.raises(openai.BadRequestError) as e:
        await qwen3.client.chat.completions.create(model="qwen3", messages=CHAT, n=2)
    assert e.value.status_code == 400
    with pytest.raises(openai.NotFoundError):
        await qwen3.client.chat.completions.create(model="nope", messages=CHAT)


async def test_metrics_and_health(qwen3):
    await qwen3.client.completions.create(model="qwen3", prompt="hello", max_tokens=3)
    async with aiohttp.ClientSession() as http:
        async with http.get(qwen3.url + "/healthz") as r:
            assert r.status == 200
            health = await r.json()
        async with http.get(qwen3.url + "/metrics") as r:
            text = await r.text()
    assert health["system_fingerprint"].startswith("fp_") and health["mode"] == "invariant"
    assert health["toolchain"] == kernels.toolchain(torch.device("cpu"))
    for name in ("detgate_backend_requests_total{status=\"200\"}", "detgate_backend_prompt_tokens_total",
                 "detgate_backend_generation_tokens_total", "detgate_backend_batch_size_bucket",
                 "detgate_backend_kv_blocks_used", "detgate_backend_kv_blocks_total", "detgate_backend_queue_depth",
                 "detgate_backend_prefix_cache_queries_total", "detgate_backend_prefix_cache_hits_total",
                 "detgate_backend_step_duration_seconds_bucket", "detgate_backend_step_handoff_wait_seconds_total"):
        assert name in text, name


@pytest.mark.parametrize("stream", [True, False])
async def test_a_client_that_leaves_frees_its_sequence(qwen3, stream):
    body = {"model": "qwen3", "prompt": "hello", "max_tokens": 240, "stream": stream, "ignore_eos": True}
    before = await metric(qwen3.url, "detgate_backend_generation_tokens_total")
    async with aiohttp.ClientSession() as http:
        if stream:
            async with http.post(qwen3.url + "/v1/completions", json=body) as r:
                assert r.status == 200
                await r.content.readline()
        else:
            with pytest.raises(asyncio.TimeoutError):
                await http.post(qwen3.url + "/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=0.05))
    for _ in range(100):
        if not qwen3.engine._seqs:
            break
        await asyncio.sleep(0.05)
    assert not qwen3.engine._seqs and not qwen3.engine.scheduler.has_work()
    assert qwen3.engine.blocks.num_used == 0
    generated = await metric(qwen3.url, "detgate_backend_generation_tokens_total") - before
    assert generated < 200   # stopped early, not run to max_tokens
    ok = await qwen3.client.completions.create(model="qwen3", prompt="hi", max_tokens=2)
    assert ok.usage.completion_tokens == 2 or ok.choices[0].finish_reason == "stop"
