"""The uncached proxy is an allow-list, not a tunnel: by default only the model listing
passes; paths are confined below the upstream's base; only allow-listed headers travel
either way; upstream errors are scrubbed of the key; and what an upstream keeps per
account (files) is its maker's alone, whether tenants share the operator's key (the
gateway checks) or each sends its own (passthrough: the upstream checks)."""
from __future__ import annotations

import socket

import openai
import pytest

from fakes.account_upstream import AccountUpstream
from fakes.loopback import LoopbackServer
from gw_http import CHAT, assert_openai_error, get, post

OPERATOR_KEY = "sk-operator-7c1d9e"
KEYS = {"acme": "gw-key-acme", "globex": "gw-key-globex"}
FILES = ["GET /models", "POST /files", "GET /files", "GET /files/{id}", "DELETE /files/{id}"]


@pytest.fixture
def account():
    fake = AccountUpstream()
    with LoopbackServer(fake.app()) as server:
        yield fake, server.url + "/v1"


def start(gateway, url: str, proxy: list[str] | None = None, key: str = OPERATOR_KEY, **settings):
    upstream = {"name": "acct", "url": url, "api_key": key, **({} if proxy is None else {"proxy": proxy})}
    return gateway(upstreams=[upstream], **settings)


def as_(gw, key: str, **options) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, **options)


def test_by_default_only_the_model_listing_is_proxied(account, gateway):
    fake, url = account
    gw = start(gateway, url, tenants=KEYS)
    acme = as_(gw, KEYS["acme"])
    listed = acme.models.with_raw_response.list()
    assert listed.headers["x-detgate-cache"] == "bypass" and [m.id for m in listed.parse()] == ["fake-model"]
    refused = [lambda: acme.files.create(file=("a.jsonl", b"{}\n"), purpose="batch"), acme.files.list,
               lambda: acme.files.retrieve("file-1"), lambda: acme.files.delete("file-1"), acme.batches.list,
               lambda: acme.fine_tuning.jobs.list(), lambda: acme.models.delete("ft:gpt-4o:acme::x")]
    for call in refused:
        with pytest.raises(openai.PermissionDeniedError) as caught:
            call()
        assert caught.value.code == "path_not_allowed"
        assert caught.value.response.headers["x-detgate-cache"] == "bypass"
    assert [(s.method, s.target) for s in fake.seen] == [("GET", "/v1/models")]


def test_allow_listed_files_under_the_operators_key_stay_their_uploaders(account, gateway):
    """One operator key is one account upstream, so the gateway keeps who made what: a file
    one tenant uploads is listed, read and deleted by that tenant alone; another gets the
    wire's 404 for it, and a listing of only its own (gateway/cache/owners.py)."""
    fake, url = account
    gw = start(gateway, url, FILES, tenants=KEYS)
    acme, globex = as_(gw, KEYS["acme"]), as_(gw, KEYS["globex"])
    made = acme.files.create(file=("a.jsonl", b"{}\n"), purpose="batch")
    assert [f.id for f in acme.files.list()] == [made.id]
    assert list(globex.files.list()) == []
    seen = len(fake.seen)
    for call in (lambda: globex.files.retrieve(made.id), lambda: globex.files.delete(made.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert len(fake.seen) == seen  # refused before the operator's key acted on it
    assert acme.files.retrieve(made.id).id == made.id
    assert {s.headers["authorization"] for s in fake.seen} == {f"Bearer {OPERATOR_KEY}"}


def test_in_passthrough_each_client_sees_only_its_own_accounts_files(account, gateway):
    fake, url = account
    gw = start(gateway, url, FILES, key=None, passthrough_auth=True)
    alice = as_(gw, "sk-alice", organization="org-alice")
    made = alice.files.create(file=("a.jsonl", b"{}\n"), purpose="batch")
    assert [f.id for f in alice.files.list()] == [made.id]
    for other in (as_(gw, "sk-bob"), as_(gw, "sk-alice"), as_(gw, "sk-alice", organization="org-alice",
                                                                 project="proj-other")):
        assert list(other.files.list()) == []
        with pytest.raises(openai.NotFoundError):
            other.files.delete(made.id)
    assert alice.files.retrieve(made.id).id == made.id
    uploads = [s for s in fake.seen if s.method == "POST"]
    assert [(s.headers["authorization"], s.headers["openai-organization"]) for s in uploads] == [
        ("Bearer sk-alice", "org-alice")]


def test_only_allow_listed_headers_travel(account, gateway):
    fake, url = account
    gw = start(gateway, url, tenants=KEYS)
    sent = {"Authorization": f"Bearer {KEYS['acme']}", "Cookie": "session=tenant-secret", "X-Forwarded-For": "10.0.0.9",
            "OpenAI-Organization": "org-theirs", "OpenAI-Project": "proj-theirs", "X-Internal-Token": "t0ken",
            "Proxy-Authorization": "Basic eDp5", "OpenAI-Beta": "assistants=v2", "Accept": "application/json"}
    reply = get(gw.url, "/v1/models", sent)
    assert reply.status == 200
    (seen,) = fake.seen
    forwarded = set(seen.headers) - {"host", "user-agent", "accept-encoding", "content-length"}
    assert forwarded == {"authorization", "openai-beta", "accept"}
    assert seen.headers["authorization"] == f"Bearer {OPERATOR_KEY}"
    # Back: how to read and when to retry, not the operator's organization, limits or cookies.
    assert {"openai-organization", "x-ratelimit-remaining-requests", "set-cookie"} <= set(fake.answer_headers)
    assert reply.headers["x-request-id"] == fake.answer_headers["x-request-id"]
    assert not {"openai-organization", "x-ratelimit-remaining-requests", "set-cookie", "openai-processing-ms"} & set(reply.headers)


def raw_request(base: str, method: str, target: str) -> tuple[int, bytes]:
    host, port = base.split("://", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"{method} {target} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1]), answer


# `{id}` matches any one segment: each of these would be one if the proxy read the path
# the way a server behind it might (decoding it, or resolving its dot segments).
ESCAPES = ["/v1/files/..", "/v1/files/%2e%2e", "/v1/files/%2E%2E", "/v1/files/.%2e", "/v1/files/..%2f..%2fadmin",
           "/v1/files/..%2F..%2Fadmin", "/v1/files/a%5c..%5c..%5cadmin", "/v1/files\\..\\admin", "/v1/files/%2e",
           "/v1//files/x", "/v1/files//x", "/v1/files/x/", "/v1/./files/x", "/v1/%2e/models", "/v1/%2e%2e/%2e%2e/x",
           "/v1/../../../v1/models", "/v1/models/%2e%2e/%2e%2e/admin", "/v1/files/%00", "/v1/files/%0d%0aX:%20y",
           "/v1/files/%zz", "/v1/files/%ff", "/v1/files/%2fetc%2fpasswd", "http://127.0.0.1:1/v1/models"]


@pytest.mark.parametrize("target", ESCAPES)
def test_paths_that_would_leave_the_base_never_reach_an_upstream(account, gateway, target):
    fake, url = account
    gw = start(gateway, url, ["GET /models", "GET /files/{id}"])
    status, answer = raw_request(gw.url, "GET", target)
    assert status in (400, 404), answer
    assert b"Traceback" not in answer
    assert fake.seen == []


def test_paths_off_the_allow_list_are_403_and_allowed_ones_arrive_as_matched(account, gateway):
    fake, url = account
    gw = start(gateway, url, ["GET /models", "GET /files/{id}"])
    for method, target in (("GET", "/v1/files"), ("DELETE", "/v1/files/x"), ("POST", "/v1/models"),
                           ("GET", "/v1/files/x/content"), ("GET", "/v1/echo/x"), ("PUT", "/v1/models")):
        status, answer = raw_request(gw.url, method, target)
        assert status == 403 and b"path_not_allowed" in answer, (method, target)
    assert fake.seen == []
    for target in ("/v1/files/file-abc", "/v1/files/a%20b", "/v1/files/a;b", "/v1/files/%C3%A9t%C3%A9",
                   "/v1/files/a%3Fb"):
        assert raw_request(gw.url, "GET", target)[0] == 404  # the fake has no such file
    assert [s.target for s in fake.seen] == ["/v1/files/file-abc", "/v1/files/a%20b", "/v1/files/a%3Bb",
                                             "/v1/files/%C3%A9t%C3%A9", "/v1/files/a%3Fb"]


def test_bad_proxy_rules_refuse_to_start(account, gateway):
    _, url = account
    for rule in ("GET models", "FETCH /models", "GET /files/../admin", "GET /files/%2e%2e", "GET /", "GET /a//b"):
        with pytest.raises(ValueError, match="proxy rule"):
            start(gateway, url, [rule])


def test_proxied_errors_are_scrubbed_of_the_operators_key(account, gateway):
    fake, url = account
    bad_key = "op-key-9f8e7d6c5b4a"  # the fake refuses it, quoting it whole
    gw = start(gateway, url, FILES, key=bad_key)
    with pytest.raises(openai.AuthenticationError) as caught:
        as_(gw, "unused").files.list()
    body = caught.value.response.content
    assert b"[redacted]" in body and bad_key.encode() not in body
    assert fake.seen[0].headers["authorization"] == f"Bearer {bad_key}"  # it was sent, and quoted


def test_every_response_says_how_the_cache_took_part(account, gateway):
    _, url = account
    gw = start(gateway, url, tenants=KEYS)
    acme = {"Authorization": f"Bearer {KEYS['acme']}"}
    replies = {
        "miss": post(gw.url, "/v1/chat/completions", {**CHAT, "model": "acct/m1"}, acme),
        "hit": post(gw.url, "/v1/chat/completions", {**CHAT, "model": "acct/m1"}, acme),
        "proxied": get(gw.url, "/v1/models", acme),
        "off the list": get(gw.url, "/v1/files", acme),
        "unauthenticated": post(gw.url, "/v1/chat/completions", CHAT),
        "invalid": post(gw.url, "/v1/chat/completions", b"{", acme),
        "unknown route": get(gw.url, "/nowhere"),
        "health": get(gw.url, "/healthz"),
    }
    assert {name: r.headers.get("x-detgate-cache") for name, r in replies.items()} == {
        "miss": "miss", "hit": "hit", "proxied": "bypass", "off the list": "bypass", "unauthenticated": "bypass",
        "invalid": "bypass", "unknown route": "bypass", "health": "bypass"}
    assert_openai_error(replies["off the list"], 403, code="path_not_allowed")
