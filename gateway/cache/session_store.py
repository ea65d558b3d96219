"""Where sessions are kept: in-process beside the embedded store, or in the gateway's Redis.

Per tenant (its tag T, gateway/cache/sessions.py), in Redis:

    detgate:s:{T}        hash  session tag -> session name    (the tenant's sessions)
    detgate:s:{T}:S      hash  entry key -> sealed turn        (one session's turns)
    detgate:m:{T}:M      set   "S entry-key"                   (the turns whose masked key is M)
    detgate:f:{T}:R      string  session tag, for a day        (the recorded session replayed run R follows)

The tenant's tag in braces is a Redis Cluster hash tag: all of a tenant's sessions share
one slot, so a turn, its session's listing and its masked-key index are written by one
script, all or nothing, and a tenant's sessions are listed without a cluster-wide scan.
A turn already recorded under the same entry key stays as it is (a re-recorded run adds
only the turns that changed); an imported session replaces the one stored, whole.
"""
from __future__ import annotations

from typing import AsyncIterator, Protocol

from redis.exceptions import RedisError

from gateway.cache.store import StoreError

# (entry key, sealed turn, its masked key or None)
Recorded = tuple[str, bytes, str | None]


class SessionStore(Protocol):
    async def add(self, tenant: str, session: str, name: str, turn: Recorded) -> bool:
        """Record one turn unless the session holds one for that entry key; True when added."""
        ...

    async def put(self, tenant: str, session: str, name: str, turns: list[Recorded]) -> None:
        """Replace a session whole (import)."""
        ...

    async def sessions(self, tenant: str) -> dict[str, str]:
        """session tag -> name, for one tenant."""
        ...

    async def turns(self, tenant: str, session: str) -> dict[str, bytes]:
        """entry key -> sealed turn, for one session."""
        ...

    async def turn(self, tenant: str, session: str, key: str) -> bytes | None:
        """One sealed turn, by the key of the entry that answered it."""
        ...

    async def count(self, tenant: str, session: str) -> int:
        """How many turns a session holds: the next turn's number."""
        ...

    async def candidates(self, tenant: str, masked: str) -> list[tuple[str, str]]:
        """(session tag, entry key) of each turn recorded under a masked key."""
        ...

    def tenants(self) -> AsyncIterator[str]:
        """Every tenant tag that has sessions (export)."""
        ...

    async def follow(self, tenant: str, session: str, recorded: str) -> None:
        """Remember, for a day, that a replayed session is being answered from a recorded one."""
        ...

    async def followed(self, tenant: str, session: str) -> str | None:
        """The recorded session a replayed session was last answered from."""
        ...


def _names(tenant: str, session: str = "", masked: str = "") -> tuple[str, str, str]:
    return f"detgate:s:{{{tenant}}}", f"detgate:s:{{{tenant}}}:{session}", f"detgate:m:{{{tenant}}}:{masked}"


_SESSIONS_PREFIX = "detgate:s:{"
FOLLOW_S = 86400  # a replay run is over long before this


def _follow_name(tenant: str, session: str) -> str:
    return f"detgate:f:{{{tenant}}}:{session}"

# KEYS: sessions, session[, index]. ARGV: session tag, name, entry key, sealed turn.
_ADD = """
if redis.call('hsetnx', KEYS[2], ARGV[3], ARGV[4]) == 0 then return 0 end
redis.call('hset', KEYS[1], ARGV[1], ARGV[2])
if KEYS[3] then redis.call('sadd', KEYS[3], ARGV[1] .. ' ' .. ARGV[3]) end
return 1
"""
# KEYS: sessions, session, then one index per turn that has one. ARGV: session tag, name,
# then per turn: entry key, sealed turn, its index's position in KEYS ("0": none).
_PUT = """
redis.call('del', KEYS[2])
redis.call('hset', KEYS[1], ARGV[1], ARGV[2])
for i = 3, #ARGV, 3 do
  redis.call('hset', KEYS[2], ARGV[i], ARGV[i + 1])
  local at = tonumber(ARGV[i + 2])
  if at > 0 then redis.call('sadd', KEYS[at], ARGV[1] .. ' ' .. ARGV[i]) end
end
return 1
"""


class RedisSessions:
    def __init__(self, client) -> None:
        self._redis = client
        self._add = client.register_script(_ADD)
        self._put = client.register_script(_PUT)

    async def add(self, tenant: str, session: str, name: str, turn: Recorded) -> bool:
        key, value, masked = turn
        sessions, listing, index = _names(tenant, session, masked or "")
        try:
            return bool(await self._add(keys=[sessions, listing] + ([index] if masked else []),
                                        args=[session, name, key, value]))
        except RedisError as exc:
            raise StoreError.of("redis session add", exc) from exc

    async def put(self, tenant: str, session: str, name: str, turns: list[Recorded]) -> None:
        sessions, listing, _ = _names(tenant, session)
        keys, args = [sessions, listing], [session, name]
        for key, value, masked in turns:
            position = 0
            if masked:
                index = _names(tenant, masked=masked)[2]
                if index not in keys:
                    keys.append(index)
                position = keys.index(index) + 1
            args += [key, value, str(position)]
        try:
            await self._put(keys=keys, args=args)
        except RedisError as exc:
            raise StoreError.of("redis session put", exc) from exc

    async def sessions(self, tenant: str) -> dict[str, str]:
        try:
            found = await self._redis.hgetall(_names(tenant)[0])
        except RedisError as exc:
            raise StoreError.of("redis sessions", exc) from exc
        return {k.decode(): v.decode() for k, v in found.items()}

    async def turns(self, tenant: str, session: str) -> dict[str, bytes]:
        try:
            found = await self._redis.hgetall(_names(tenant, session)[1])
        except RedisError as exc:
            raise StoreError.of("redis session turns", exc) from exc
        return {k.decode(): v for k, v in found.items()}

    async def turn(self, tenant: str, session: str, key: str) -> bytes | None:
        try:
            return await self._redis.hget(_names(tenant, session)[1], key)
        except RedisError as exc:
            raise StoreError.of("redis session turn", exc) from exc

    async def count(self, tenant: str, session: str) -> int:
        try:
            return int(await self._redis.hlen(_names(tenant, session)[1]))
        except RedisError as exc:
            raise StoreError.of("redis session count", exc) from exc

    async def candidates(self, tenant: str, masked: str) -> list[tuple[str, str]]:
        try:
            found = await self._redis.smembers(_names(tenant, masked=masked)[2])
        except RedisError as exc:
            raise StoreError.of("redis session index", exc) from exc
        return sorted(tuple(m.decode().split(" ", 1)) for m in found)

    async def tenants(self) -> AsyncIterator[str]:
        try:
            async for name in self._redis.scan_iter(match=_SESSIONS_PREFIX + "*", count=1000):
                name = name.decode()
                if name.endswith("}"):  # the tenant's listing, not one of its sessions
                    yield name[len(_SESSIONS_PREFIX):-1]
        except RedisError as exc:
            raise StoreError.of("redis scan", exc) from exc


    async def follow(self, tenant: str, session: str, recorded: str) -> None:
        try:
            await self._redis.set(_follow_name(tenant, session), recorded, ex=FOLLOW_S)
        except RedisError as exc:
            raise StoreError.of("redis session follow", exc) from exc

    async def followed(self, tenant: str, session: str) -> str | None:
        try:
            found = await self._redis.get(_follow_name(tenant, session))
        except RedisError as exc:
            raise StoreError.of("redis session follow", exc) from exc
        return None if found is None else found.decode()


class MemorySessions:
    """In-process, for the embedded store; bounded by bytes: once full, new turns are not
    recorded (and the answer says so), rather than dropping turns of recorded sessions."""

    MAX_FOLLOWED = 4096  # replay runs remembered, oldest dropped first

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._followed: dict[tuple[str, str], str] = {}
        self._sessions: dict[str, dict[str, str]] = {}
        self._turns: dict[tuple[str, str], dict[str, bytes]] = {}
        self._index: dict[tuple[str, str], set[tuple[str, str]]] = {}

    async def add(self, tenant: str, session: str, name: str, turn: Recorded) -> bool:
        key, value, masked = turn
        turns = self._turns.setdefault((tenant, session), {})
        if key in turns:
            return False
        if self.nbytes + len(value) > self.max_bytes:
            raise StoreError("in-process session store full")
        turns[key] = value
        self.nbytes += len(value)
        self._sessions.setdefault(tenant, {})[session] = name
        if masked:
            self._index.setdefault((tenant, masked), set()).add((session, key))
        return True

    async def put(self, tenant: str, session: str, name: str, turns: list[Recorded]) -> None:
        old = self._turns.pop((tenant, session), {})
        self.nbytes -= sum(len(v) for v in old.values())
        stored = self._turns[(tenant, session)] = {}
        for key, value, masked in turns:
            stored[key] = value
            self.nbytes += len(value)
            if masked:
                self._index.setdefault((tenant, masked), set()).add((session, key))
        self._sessions.setdefault(tenant, {})[session] = name

    async def sessions(self, tenant: str) -> dict[str, str]:
        return dict(self._sessions.get(tenant, {}))

    async def turns(self, tenant: str, session: str) -> dict[str, bytes]:
        return dict(self._turns.get((tenant, session), {}))

    async def turn(self, tenant: str, session: str, key: str) -> bytes | None:
        return self._turns.get((tenant, session), {}).get(key)

    async def count(self, tenant: str, session: str) -> int:
        return len(self._turns.get((tenant, session), ()))

    async def candidates(self, tenant: str, masked: str) -> list[tuple[str, str]]:
        return sorted(self._index.get((tenant, masked), ()))

    async def tenants(self) -> AsyncIterator[str]:
        for tenant in list(self._sessions):
            yield tenant

    async def follow(self, tenant: str, session: str, recorded: str) -> None:
        self._followed.pop((tenant, session), None)
        if len(self._followed) >= self.MAX_FOLLOWED:
            del self._followed[next(iter(self._followed))]
        self._followed[(tenant, session)] = recorded

    async def followed(self, tenant: str, session: str) -> str | None:
        return self._followed.get((tenant, session))
