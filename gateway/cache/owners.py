"""The ownership registry: which ids of upstream state each tenant was served or created,
and, for an answer a later request may continue (the Responses API's
`previous_response_id`), the cache key it is stored under.

Under the operator's key an upstream sees every tenant as one account, so an id of
upstream state (a response, an output item, a conversation, a container, a file, a
vector store) would act for whoever names it. Whenever a tenant is served an answer, the
ids it names are recorded here (`served`), and so is the id of every object a proxied
call creates for it (`created`); a request or a proxied route that names an id this
tenant was neither served nor made is refused (gateway/route/chains.py,
gateway/ingress/proxy.py). One record per (tenant, upstream, id): its value is the
answer's cache key for an answer's own id ("" for one served unstored, or for any other
id), which is how a continuing request is keyed on its parent (`keys.chained`), so every
turn of a conversation is keyed on all the turns before it and the whole chain replays
from the cache, in `--mode replay` too. Records are signed over the tenant's name as well
as its namespace: tenants that share entries still own only the ids each was served.

Records are stored as entries are (sealed, under dg2 keys, first writer wins): those of an
answer expire, export and import with it; those of a created object are kept until evicted.
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Iterable

from gateway.cache.entry import Entry, now_in_ms
from gateway.cache.singleflight import SingleFlight
from gateway.policy.canonical import canonical_json
from gateway.policy.keys import KeyParts, sign

if TYPE_CHECKING:
    from gateway.config import Settings
    from gateway.ingress.auth import Tenant, Tenants

LINK = "link"  # the finish of a record entry, whose body is the key it points at ("" for none)
_ROUTE = "#answer-id"  # no surface is named so: record keys never meet request keys
_OWNER = "chains"  # a fill-lock owner no one holds: commit then only writes


def enforced(settings: Settings, tenants: Tenants) -> bool:
    """Whether upstreams see several tenants as one account (the operator's key), so that a
    tenant may name only the ids it owns: with its own key (passthrough) the upstream checks."""
    return not settings.passthrough_auth and len({tenant.name for _, tenant in tenants.keys}) > 1


class Owners:
    MEMO = 4096  # answers whose records are known stored, so that a hot hit writes nothing and reads no body

    def __init__(self, flights: SingleFlight, secret: bytes) -> None:
        self.flights = flights
        self.secret = secret
        # (tenant, upstream, the entry's key, or for an answer not stored its id): records written
        self._written: dict[tuple[Tenant, str, str], None] = {}

    def known(self, tenant: Tenant, upstream: str, key: str) -> bool:
        """Whether the records of the entry stored under `key` are known stored for `tenant`."""
        return (tenant, upstream, key) in self._written

    def _key(self, tenant: Tenant, upstream: str, named: str) -> str:
        return sign(self.secret, KeyParts(tenant.namespace, upstream, "", _ROUTE, "",
                                          canonical_json([tenant.name, named])))

    def _remember(self, seen: tuple[Tenant, str, str]) -> None:
        if len(self._written) >= self.MEMO:
            del self._written[next(iter(self._written))]
        self._written[seen] = None

    async def _write(self, tenant: Tenant, upstream: str, named: str, value: str, model: str,
                     expires: int | None, now: int) -> None:
        record = self._key(tenant, upstream, named)
        entry = Entry(value.encode(), None, model, LINK, expires_ms=expires)
        await self.flights.store.commit(record, self.flights.sealer.seal(record, entry), _OWNER,
                                        ttl_ms=expires - now if expires is not None else 0)

    async def served(self, tenant: Tenant, upstream: str, answer: str | None, named: Iterable[str], key: str,
                     entry: Entry) -> None:
        """Record that `tenant` was served `entry`, stored under `key` ("" when it was not
        stored): its own id `answer` (None where it has none) pointing at `key`, and the
        other ids of upstream state it names. The records age out with the entry (an unstored
        one's as an entry of its model would). Raises StoreError."""
        seen = (tenant, upstream, key or "#" + (answer or ""))  # "#": no cache key starts so
        if seen in self._written:
            return
        now = now_in_ms()
        if key:
            expires = entry.expires_ms
        else:
            ttl_ms = self.flights.rules.ttl_ms(entry.model)
            expires = now + ttl_ms if ttl_ms else None
        if expires is not None and expires <= now:
            return  # the entry has aged out: nothing is left to continue from the cache
        records = {name: "" for name in named}
        if answer is not None:
            records[answer] = key
        await asyncio.gather(*(self._write(tenant, upstream, name, value, entry.model, expires, now)
                               for name, value in records.items()))
        if key or answer is not None:
            self._remember(seen)

    async def created(self, tenant: Tenant, upstream: str, named: Iterable[str]) -> None:
        """Record the ids of objects a proxied call made or listed for `tenant`. Raises StoreError."""
        now = now_in_ms()
        await asyncio.gather(*(self._write(tenant, upstream, name, "", "", None, now) for name in set(named)))

    async def parent(self, tenant: Tenant, upstream: str, named: str) -> str | None:
        """The key the answer `named` is stored under ("" for one served unstored, or an id
        that is not an answer's); None for an id this gateway did not serve or make for
        `tenant`, or no longer remembers. Raises StoreError."""
        record = self._key(tenant, upstream, named)
        raw = await self.flights.store.get(record)
        entry = None if raw is None else self.flights.unseal(record, raw)
        if entry is None or entry.finish != LINK or entry.expired():
            return None
        return entry.body.decode()

    async def owns(self, tenant: Tenant, upstream: str, named: str) -> bool:
        """Whether `tenant` was served or made the id `named` at `upstream`. Raises StoreError."""
        return await self.parent(tenant, upstream, named) is not None
