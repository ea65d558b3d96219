"""Clients cannot make the gateway call a URL of their choosing: model names that look like
URLs or paths, Host and forwarding headers, absolute request targets and dot segments all
end at a configured upstream (or at a 4xx), never anywhere else."""
from __future__ import annotations

import socket

import pytest
from aiohttp import web

from fakes.loopback import LoopbackServer
from gw_http import CHAT, get, post


@pytest.fixture
def evil():
    """A server nobody should ever reach; counts who does."""
    hits = []

    async def anything(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.json_response({"evil": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    with LoopbackServer(app) as server:
        yield server, hits


def models_pointing_at(url: str) -> list[str]:
    host = url.split("://", 1)[1]
    return [url + "/v1", url + "/v1/chat/completions", f"//{host}/v1", f"{host}/v1", "../../../etc/passwd",
            "fake/../../x", f"fake/{url}/v1", f"fake@{host}", f"{url}#fake/m1", "file:///etc/passwd"]


def test_model_names_cannot_pick_a_url(upstream, gateway, evil):
    fake, _ = upstream
    server, hits = evil
    gw = gateway()
    sent = []
    for model in models_pointing_at(server.url):
        reply = post(gw.url, "/v1/chat/completions", {**CHAT, "model": model})
        assert reply.status == 200 or 400 <= reply.status < 500, reply.body
        if reply.status == 200:
            sent.append(model)
    assert hits == []
    # Each reached the configured upstream as a plain model name, the "fake/" prefix routing only
    # (two of them are then the same request, answered once).
    assert {body["model"] for _, body in fake.calls} == {m[len("fake/"):] if m.startswith("fake/") else m for m in sent}


def test_headers_cannot_redirect_the_upstream_call(upstream, gateway, evil):
    fake, _ = upstream
    server, hits = evil
    gw = gateway()
    host = server.url.split("://", 1)[1]
    tricks = {"Host": host, "X-Forwarded-Host": host, "X-Forwarded-Proto": "http", "Forwarded": f"host={host}",
              "X-Original-URL": server.url, "X-Rewrite-URL": server.url, "x-detgate-upstream": server.url}
    assert post(gw.url, "/v1/chat/completions", CHAT, headers=tricks).status == 200
    assert get(gw.url, "/v1/models", headers=tricks).status == 200
    assert hits == [] and len(fake.calls) == 1


def raw_request(base: str, first_line: str) -> bytes:
    host, port = base.split("://", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"{first_line}\r\nHost: {host}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}".encode())
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_absolute_targets_and_dot_segments_stay_on_the_gateway(upstream, gateway, evil):
    fake, url = upstream
    server, hits = evil
    gw = gateway(upstreams=[{"name": "fake", "url": url, "proxy": ["POST /echo/{what}"]}])
    for line in (f"POST {server.url}/v1/echo/x HTTP/1.1", "POST /v1/../../../v1/echo/x HTTP/1.1",
                 "POST /v1/%2e%2e/%2e%2e/echo/x HTTP/1.1", f"POST /v1/echo/{server.url} HTTP/1.1"):
        answer = raw_request(gw.url, line)
        status = int(answer.split(b" ", 2)[1])
        assert status == 404, answer
    assert hits == []
    # What the proxy route did pass on went to the configured upstream's echo route.
    assert all(path.startswith("/v1/") for path, _ in fake.calls)
