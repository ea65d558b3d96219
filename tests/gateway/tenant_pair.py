"""Two tenants, alice and bob, on one gateway whose upstreams they reach under the operator's
key (the default deployment): the official openai and anthropic clients for each, shared
by the test_tenant_state_* tests."""
from __future__ import annotations

import anthropic
import openai

KEYS = {"alice": "gw-key-alice", "bob": "gw-key-bob"}
TENANTS = {name: {"key": key} for name, key in KEYS.items()}
# The proxied routes of stored responses and conversations, as an operator opens them for background polling.
RESPONSE_ROUTES = ["GET /models", "POST /conversations", "GET /responses/{id}", "DELETE /responses/{id}",
                   "GET /responses/{id}/input_items"]


def upstreams(upstream, claude) -> list:
    return [{"name": "fake", "url": upstream[1], "api_key": "sk-operator", "proxy": RESPONSE_ROUTES},
            {"name": "claude", "url": claude[1], "profile": "anthropic", "api_key": "sk-operator"}]


def start(gateway, upstream, claude, redis_url: str, **settings):
    return gateway(upstreams=upstreams(upstream, claude), tenants=TENANTS, redis_url=redis_url,
                   near_cache_ttl_s=0, **settings)


def openai_as(gw, name: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=KEYS[name], max_retries=0)


def anthropic_as(gw, name: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key=KEYS[name], max_retries=0)
