"""The backend says what it is (so a gateway picks the whitebox profile unconfigured) and which
defaults from generation_config.json a response used."""
from __future__ import annotations

import json
import shutil

import aiohttp

import kernels
from conftest import Server, make_engine

CHAT = [{"role": "user", "content": "hello there"}]


async def test_models_announce_the_whitebox_profile(qwen3):
    async with aiohttp.ClientSession() as http:
        async with http.get(qwen3.url + "/v1/models") as r:
            body = await r.json()
            assert r.headers["x-detgate-backend"] == "whitebox"
    (model,) = body["data"]
    assert model["owned_by"] == "detgate"
    assert model["detgate"] == {"profile": "whitebox", "mode": "invariant",
                                "system_fingerprint": qwen3.engine.fingerprint,
                                "kernel_version": kernels.KERNEL_VERSION,
                                "features": ["guided_decoding", "min_p", "min_tokens", "repetition_penalty",
                                             "strict_json", "structured_outputs"]}


async def test_every_response_names_the_backend(qwen3):
    async with aiohttp.ClientSession() as http:
        for method, path, body in (("GET", "/healthz", None), ("GET", "/metrics", None), ("GET", "/nowhere", None),
                                   ("POST", "/v1/chat/completions", {"model": "other", "messages": CHAT}),
                                   ("POST", "/v1/completions", {"model": "qwen3", "prompt": "hi", "max_tokens": 2,
                                                                "stream": True})):
            async with http.request(method, qwen3.url + path, json=body) as r:
                await r.read()
                assert r.headers["x-detgate-backend"] == "whitebox", (path, r.status)


async def test_generation_config_defaults_apply_only_when_unset_and_are_stated(checkpoints, tmp_path):
    path = shutil.copytree(checkpoints["qwen3"], tmp_path / "qwen3")
    (path / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "top_k": 20}))
    async with Server(make_engine(path), "qwen3") as s:
        r = await s.client.chat.completions.create(model="qwen3", messages=CHAT, max_tokens=8)
        assert r.model_extra["sampling_defaults"] == {"temperature": 0.0, "top_k": 20}
        greedy = await s.client.chat.completions.create(model="qwen3", messages=CHAT, max_tokens=8, temperature=0)
        assert greedy.choices[0].message.content == r.choices[0].message.content   # the default made it greedy
        assert greedy.model_extra["sampling_defaults"] == {"top_k": 20}
        asked = await s.client.chat.completions.create(model="qwen3", messages=CHAT, max_tokens=8, temperature=0,
                                                       extra_body={"top_k": 0})
        assert "sampling_defaults" not in asked.model_extra
        chunks = [c async for c in await s.client.chat.completions.create(
            model="qwen3", messages=CHAT, max_tokens=4, stream=True)]
        assert all(c.model_extra["sampling_defaults"] == {"temperature": 0.0, "top_k": 20} for c in chunks)


async def test_healthz_names_the_compute_and_checkpoint_dtypes(qwen3):
    async with aiohttp.ClientSession() as http:
        async with http.get(qwen3.url + "/healthz") as r:
            body = await r.json()
    assert (body["dtype"], body["checkpoint_dtype"]) == ("float32", "bfloat16")   # the CPU computes in fp32
