"""A tenant's recorded sessions, asked about one request: keep it as a turn (`--mode
record`); find the turn recorded for the same conversation with other tool outputs, or
the recording nearest it and where they differ (`--mode replay`, `detgate cache diff`).
docs/sessions.md."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import orjson

from gateway.cache.session_store import SessionStore
from gateway.cache.store import StoreError
from gateway.cache.sessions import (
    UNNAMED,
    Turn,
    changed_outputs,
    masked,
    masked_key,
    seal,
    session_name,
    session_tag,
    tenant_tag,
    tool_outputs,
    unseal,
)
from gateway.policy.json_diff import Difference, differences, leaves, shortened, similarity
from gateway.policy.keys import KeyParts, chained, sign
from gateway.policy.prepare import Prepared

MAX_CANDIDATES = 32  # turns of one masked key weighed against each other
MAX_COMPARED = 400  # recorded turns a miss is compared with, its own session's first
MAX_PATHS = 8  # tool-output paths a warning names


@dataclass(frozen=True)
class Asking:
    """A request as sessions see it: what its key is signed over, and its session."""

    parts: KeyParts
    session: str
    upstream: str
    model: str
    apart: str  # what its answers are kept apart by (Surface.apart), bound into its keys

    def document(self) -> Any:
        return orjson.loads(self.parts.canonical)

    def bound(self, secret: bytes, key: str) -> str:
        """A key bound to what this request's answers are kept apart by, as the route binds
        its entry key (gateway/route/chains.py: kept_apart)."""
        return chained(secret, key, "#" + self.apart) if self.apart else key


def asking(prepared: Prepared, headers: Mapping[str, str], apart: str) -> Asking | None:
    """None where sessions do not apply: normal mode, or a request answered in parts."""
    if prepared.parts is None:
        return None
    call = prepared.call
    return Asking(prepared.parts, session_name(headers, call.body), call.upstream.name, prepared.model, apart)


OWN, FOLLOWED, OTHER = "own", "followed", "other"  # where a nearest turn was found


@dataclass(frozen=True)
class Found:
    """A recorded turn, with where it was found: the request's own session (the same name
    recorded), the recorded session its replay run has been answered from, another."""

    turn: Turn
    where: str

    def place(self) -> str:
        if self.where == OWN:
            return "its own session"
        if self.where == FOLLOWED:
            return f"the recorded session this run follows ({_quoted(self.turn.session)})"
        return f"session {_quoted(self.turn.session)}"


def _quoted(name: str) -> str:
    return json.dumps(name[:80]) if name != UNNAMED else "(requests without a session header)"


@dataclass(frozen=True)
class Recordings:
    """The session store, with what checks a recorded turn against a request. Each method
    that reads or writes raises StoreError when the store fails."""

    store: SessionStore
    secret: bytes
    rotated: Callable[[str, str, str], str]  # (key, upstream, model) -> the key now (DriftMonitor.key)

    async def record(self, asking: Asking, key: str) -> bool:
        """Keep the turn of an answer just stored under `key`; False when the session already
        holds that turn."""
        parts = asking.parts
        tenant = tenant_tag(self.secret, parts.tenant)
        session = session_tag(self.secret, tenant, asking.session)
        form = masked(parts.route, parts.canonical)
        turn = Turn(asking.session, await self.store.count(tenant, session), int(time.time() * 1000), parts.route,
                    asking.model, key, self.masked_key(asking, form) if form else None, parts.canonical)
        sealed = seal(self.secret, tenant, session, turn)
        return await self.store.add(tenant, session, asking.session, (key, sealed, turn.masked))

    def key(self, asking: Asking) -> str:
        """The entry key of the request, as the cache has it now."""
        return asking.bound(self.secret, self.rotated(sign(self.secret, asking.parts), asking.upstream, asking.model))

    def masked_key(self, asking: Asking, form: bytes) -> str:
        """The request's masked key, in the namespace its model's keys are in now (a drift
        rotation leaves the turns recorded before it behind, as it leaves their entries)."""
        key = self.rotated(masked_key(self.secret, asking.parts, form), asking.upstream, asking.model)
        return asking.bound(self.secret, key)

    async def same_but_tool_outputs(self, asking: Asking) -> tuple[Turn, list[str]] | None:
        """The turn recorded for this conversation with other tool outputs, and the paths of
        the outputs that differ: one of the recorded session this replay run has been answered
        from, else the one that differs in fewest outputs, then whose outputs share the most
        words with these, then the latest. Only a turn sealed with this masked key counts:
        recorded for this tenant, upstream, model, strategy and keyed headers, whatever an
        index entry says. The run is then known to follow the turn's session."""
        parts = asking.parts
        form = masked(parts.route, parts.canonical)
        if form is None:
            return None
        tenant = tenant_tag(self.secret, parts.tenant)
        own = session_tag(self.secret, tenant, asking.session)
        followed = await self.store.followed(tenant, own) if asking.session != UNNAMED else None
        sent, masked_as = asking.document(), self.masked_key(asking, form)
        best = None
        for session, key in (await self.store.candidates(tenant, masked_as))[:MAX_CANDIDATES]:
            value = await self.store.turn(tenant, session, key)
            turn = None if value is None else unseal(self.secret, tenant, session, value)
            if turn is None or turn.masked != masked_as or turn.key != key:
                continue
            changed, shared = changed_outputs(parts.route, turn.document(), sent)
            rank = (session != followed, len(changed), -shared, -turn.at_ms)
            if best is None or rank < best[0]:
                best = (rank, session, turn, changed)
        if best is None:
            return None
        if asking.session != UNNAMED and best[1] != followed:
            try:
                await self.store.follow(tenant, own, best[1])
            except StoreError:
                pass  # the turn is found all the same; the run's next miss is compared by similarity
        return best[2:]

    async def nearest(self, asking: Asking) -> Found | None:
        """The recorded turn nearest this request: in its own session where that was
        recorded, or in the recorded session its replay run has been answered from, else
        among the tenant's recordings for the same surface and model."""
        parts = asking.parts
        tenant = tenant_tag(self.secret, parts.tenant)
        listing = await self.store.sessions(tenant)
        own, where = None, OTHER
        if asking.session != UNNAMED:
            own, where = session_tag(self.secret, tenant, asking.session), OWN
            if own not in listing:
                own, where = await self.store.followed(tenant, own), FOLLOWED
        order = ([own] if own in listing else []) + sorted(s for s in listing if s != own)
        sent = leaves(asking.document())
        best, compared = None, 0
        for session in order:
            for value in (await self.store.turns(tenant, session)).values():
                turn = unseal(self.secret, tenant, session, value)
                if turn is None or turn.route != parts.route or turn.model != asking.model:
                    continue
                compared += 1
                score = similarity(leaves(turn.document()), sent)
                if best is None or (score, turn.at_ms) > (best[0], best[1].turn.at_ms):
                    best = (score, Found(turn, where if session == own else OTHER))
                if compared >= MAX_COMPARED:
                    return best[1]
            if best is not None and best[1].where != OTHER:
                return best[1]  # the request's own session was recorded: its nearest turn is the one
        return None if best is None else best[1]


def replay_warning(turn: Turn, changed: list[str]) -> str:
    more = f" and {len(changed) - MAX_PATHS} more" if len(changed) > MAX_PATHS else ""
    return (f"session replay: turn {turn.n} of session {_quoted(turn.session)} answered, its tool outputs "
            f"differing from the recording at {', '.join(changed[:MAX_PATHS]) + more or 'no path'}")


def gone(turn: Turn) -> str:
    """What a replay miss says when the turn that matches has lost its answer."""
    return (f"Turn {turn.n} of session {_quoted(turn.session)} matches it apart from tool outputs, but its recorded "
            "answer is no longer stored (past its TTL, or deleted): record it again or import the golden file.")


def outside_tool_outputs(route: str, recorded: Any, sent: Any) -> list[Difference]:
    """The differences that are not what tools returned (those a replay tolerates)."""
    skip = [path for path, _, _ in tool_outputs(route, sent)] + [path for path, _, _ in tool_outputs(route, recorded)]
    return [d for d in differences(recorded, sent)
            if not any(d.path == p or d.path.startswith((p + ".", p + "[")) for p in skip)]


def explain(found: Found, route: str, sent: Any) -> tuple[str, str | None]:
    """(what a replay miss says about its nearest recording, the first path that differs)."""
    head = f"The nearest recording is turn {found.turn.n} of {found.place()}"
    diffs = outside_tool_outputs(route, found.turn.document(), sent)
    if not diffs:
        return (f"{head}, whose keyed body is the same apart from tool outputs: what differs is outside the body "
                "(a keyed header such as anthropic-version or anthropic-beta, the upstream, the strategy).", None)
    first = diffs[0]
    recorded, sent_value = shortened(first)
    return (f"{head}; the first difference is at {first.path}: recorded {recorded}, sent {sent_value} "
            f"({len(diffs)} difference{'s' if len(diffs) > 1 else ''} in all).", first.path)
