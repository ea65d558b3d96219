"""Upstreams that say what they are: a detgate backend announces its profile.

An upstream configured without a profile is asked for its model list. A detgate backend
marks each model with `"detgate": {"profile": ...}` (`whitebox` when its kernels are
batch-invariant and its sampling is seeded), and the gateway then treats it by that profile
instead of the generic one, which would take out top_p and top_k and so answer a top-k
request from a plain request's entry. A profile set in config (or as
`--upstream NAME=URL#PROFILE`) is never second-guessed.

An upstream is asked when the gateway starts and, until it answers (a backend started after
the gateway, one restarting), again and again with a growing pause (RETRY_FIRST_S doubling
to RETRY_MAX_S). Meanwhile it is "pending": its profile is the generic one only as a guess,
and a request the guess would rewrite (a parameter taken out or set) is not answered from
it (its top_p or top_k taken out): it asks the upstream at once and waits for the answer
(TIMEOUT_S at most), and if the upstream still has not said what it is, gets a 503 saying
so. Any other request is served under the guess, whose changes x-detgate-warnings names. An upstream that answers without announcing a profile is an ordinary
OpenAI-compatible server: it is not asked again.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from gateway.config import Settings, UpstreamConfig
from gateway.errors import ApiError
from gateway.upstream.wires import credential_headers

log = logging.getLogger("detgate")

TIMEOUT_S = 3.0
# Names the probe in the upstream's logs (and lets an upstream's tests tell it from proxied calls).
USER_AGENT = "detgate-discovery"
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0
SILENT = object()   # what _ask returns for an upstream that did not answer
GUESSED = frozenset({"top_p", "top_k"})   # what the generic profile takes out that a whitebox one keeps


def announced(models: Any) -> str | None:
    """The profile a /models answer announces; None when it announces none."""
    data = models.get("data") if isinstance(models, dict) else None
    for item in data if isinstance(data, list) else ():
        profile = (item.get("detgate") or {}).get("profile") if isinstance(item, dict) else None
        if isinstance(profile, str) and profile:
            return profile
    return None


async def _ask(session: aiohttp.ClientSession, upstream: UpstreamConfig):
    """The profile the upstream announces, None when it answers without one, SILENT when it
    does not answer."""
    # Asked as an OpenAI-compatible server is: only an upstream without a profile is asked.
    headers = {**dict(credential_headers("openai", upstream.key())), "User-Agent": USER_AGENT}
    try:
        async with session.get(upstream.url + "/models", headers=headers,
                               timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as resp:
            if resp.status != 200:
                return SILENT if resp.status >= 500 else None
            return announced(orjson.loads(await resp.read()))
    except (aiohttp.ClientError, asyncio.TimeoutError, orjson.JSONDecodeError) as exc:
        log.debug("upstream %r did not say what it is: %r", upstream.name, exc)
        return SILENT


def with_profile(settings: Settings, name: str, profile: str) -> Settings:
    upstreams = tuple(u.model_copy(update={"profile": profile}) if u.name == name else u for u in settings.upstreams)
    return settings.model_copy(update={"upstreams": upstreams})


class Discovery:
    """The settings as learned so far, and the upstreams still to say what they are."""

    def __init__(self, settings: Settings, on_change: Callable[[], None] = lambda: None) -> None:
        self.settings = settings
        self.on_change = on_change   # called when `settings` changes (prepared requests of before are stale)
        self.pending = {u.name for u in settings.upstreams if "profile" not in u.model_fields_set}
        self._asked = asyncio.Event()   # set to ask the pending upstreams now
        self._round: asyncio.Future | None = None   # the round of asking under way

    def _apply(self, name: str, found) -> None:
        if found is SILENT:
            return
        self.pending.discard(name)
        upstream = next(u for u in self.settings.upstreams if u.name == name)
        if found is None:
            log.info("upstream %r announces no profile: it keeps %s", name, upstream.profile)
            return
        if found not in self.settings.rules.profiles:
            log.warning("upstream %r announces profile %r, which this gateway does not know; keeping %s",
                        name, found, upstream.profile)
            return
        if found != upstream.profile:
            log.info("upstream %r announces itself as %s", name, found)
            self.settings = with_profile(self.settings, name, found)
            self.on_change()

    async def ask(self, session: aiohttp.ClientSession) -> None:
        """One round: every pending upstream asked at once."""
        if self._round is not None:   # a round is under way: wait for it rather than start another
            await asyncio.shield(self._round)
            return
        self._round = asyncio.get_running_loop().create_future()
        try:
            names = sorted(self.pending)
            upstreams = [u for u in self.settings.upstreams if u.name in names]
            for upstream, found in zip(upstreams, await asyncio.gather(*(_ask(session, u) for u in upstreams))):
                self._apply(upstream.name, found)
        finally:
            self._round.set_result(None)
            self._round = None

    async def keep_asking(self, session: aiohttp.ClientSession) -> None:
        """Ask the pending upstreams until none is left, pausing longer each round (or not at all
        when a request pokes)."""
        pause = RETRY_FIRST_S
        while self.pending:
            try:
                await asyncio.wait_for(self._asked.wait(), pause)
            except asyncio.TimeoutError:
                pause = min(pause * 2, RETRY_MAX_S)
            self._asked.clear()
            await self.ask(session)

    async def wait_for(self, name: str) -> None:
        """Ask now for one pending upstream, and wait (TIMEOUT_S at most) until that round is done."""
        self._asked.set()
        deadline = asyncio.get_running_loop().time() + TIMEOUT_S + 0.5
        while name in self.pending and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)

    def guessed(self, upstream: UpstreamConfig, rewrites: Iterable[str]) -> list[str]:
        """The sampling parameters of a request to `upstream` that only a guess of its profile
        takes out or forces (top_p, top_k): none once it has said what it is. (The guess's other
        changes, a temperature set where none was sent, are those any black box gets, and are
        named in x-detgate-warnings.)"""
        return sorted(set(rewrites) & GUESSED) if upstream.name in self.pending else []

    def refuse_guess(self, upstream: UpstreamConfig, rewrites: Iterable[str]) -> None:
        """503 for a request to a pending upstream that its guessed profile would rewrite."""
        rewritten = self.guessed(upstream, rewrites)
        if rewritten:
            raise ApiError(503, f"Upstream {upstream.name!r} has not yet said what it is (it is asked again until it "
                                f"answers), and its guessed profile {upstream.profile!r} would change "
                                f"{', '.join(rewritten)}; retry shortly, or set its profile with "
                                f"--upstream {upstream.name}={upstream.url}#PROFILE.",
                           type="upstream_error", code="upstream_profile_unknown", headers={"Retry-After": "1"})


async def settled(discovery: Discovery, prepare: Callable[[Settings], Any]):
    """`prepare(settings)` under a known profile: a request the guess would rewrite waits for its
    upstream to be asked again, then is prepared under what it said, or refused (503)."""
    prepared = prepare(discovery.settings)
    upstream = prepared.call.upstream
    if discovery.guessed(upstream, prepared.rewrites):
        await discovery.wait_for(upstream.name)
        prepared = prepare(discovery.settings)
        discovery.refuse_guess(prepared.call.upstream, prepared.rewrites)
    return prepared


def warn_pending(discovery: Discovery) -> None:
    for upstream in discovery.settings.upstreams:
        if upstream.name in discovery.pending:
            log.warning("upstream %r did not say what it is: asking again until it does; meanwhile requests its "
                        "guessed %s profile would rewrite wait for it or get a 503 (set one with "
                        "--upstream %s=%s#PROFILE)", upstream.name, upstream.profile, upstream.name, upstream.url)


async def discovering(app: web.Application, discovery: Discovery) -> AsyncIterator[None]:
    """A cleanup context: the first round before serving, then the rest in the background."""
    if not discovery.pending:
        yield
        return
    session = aiohttp.ClientSession()
    await discovery.ask(session)
    warn_pending(discovery)
    task = asyncio.create_task(discovery.keep_asking(session))
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await session.close()
