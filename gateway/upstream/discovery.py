"""Upstreams that say what they are: a detgate backend announces its profile.

An upstream configured without a profile is asked once, at start, for its model list. A
detgate backend marks each model with `"detgate": {"profile": ...}` (`whitebox` when its
kernels are batch-invariant and its sampling is seeded), and the gateway then treats it
by that profile instead of the generic one, which would take out top_p and top_k and so
answer a top-k request from a plain request's entry. A profile set in config (or as
`--upstream NAME=URL#PROFILE`) is never second-guessed; an upstream that does not answer
keeps the generic profile, with a warning saying how to set it.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import orjson

from gateway.config import Settings, UpstreamConfig
from gateway.upstream.wires import credential_headers

log = logging.getLogger("detgate")

TIMEOUT_S = 3.0


def announced(models: Any) -> str | None:
    """The profile a /models answer announces; None when it announces none."""
    data = models.get("data") if isinstance(models, dict) else None
    for item in data if isinstance(data, list) else ():
        profile = (item.get("detgate") or {}).get("profile") if isinstance(item, dict) else None
        if isinstance(profile, str) and profile:
            return profile
    return None


async def _ask(session: aiohttp.ClientSession, upstream: UpstreamConfig) -> str | None:
    # Asked as an OpenAI-compatible server is: only an upstream without a profile is asked.
    headers = dict(credential_headers("openai", upstream.key()))
    try:
        async with session.get(upstream.url + "/models", headers=headers,
                               timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as resp:
            if resp.status != 200:
                return None
            return announced(orjson.loads(await resp.read()))
    except (aiohttp.ClientError, asyncio.TimeoutError, orjson.JSONDecodeError) as exc:
        log.warning("upstream %r did not say what it is (%r): it keeps the %s profile; set one with "
                    "--upstream %s=%s#PROFILE", upstream.name, exc, upstream.profile, upstream.name, upstream.url)
        return None


async def discover(settings: Settings) -> Settings:
    """`settings` with each unset upstream profile replaced by the one its upstream announces."""
    unset = [u for u in settings.upstreams if "profile" not in u.model_fields_set]
    if not unset:
        return settings
    async with aiohttp.ClientSession() as session:
        found = dict(zip((u.name for u in unset), await asyncio.gather(*(_ask(session, u) for u in unset))))
    known = settings.rules.profiles
    upstreams = []
    for upstream in settings.upstreams:
        profile = found.get(upstream.name)
        if profile is not None and profile not in known:
            log.warning("upstream %r announces profile %r, which this gateway does not know; keeping %s",
                        upstream.name, profile, upstream.profile)
            profile = None
        if profile is not None and profile != upstream.profile:
            log.info("upstream %r announces itself as %s", upstream.name, profile)
            upstream = upstream.model_copy(update={"profile": profile})
        upstreams.append(upstream)
    return settings.model_copy(update={"upstreams": tuple(upstreams)})
