"""The answer ids each tenant was served: how a request that continues an earlier answer
(the Responses API's `previous_response_id`) is keyed, and whether the tenant may.

Whenever a tenant is served an answer that names itself (`Surface.answer_id`), a link is
stored: (tenant, upstream, answer id) -> the cache key the answer is stored under, or ""
for one that was not stored. A request that continues the id is then keyed on its
parent's key as well as on its own canonical form (`keys.chained`), so every turn of a
conversation is keyed on all the turns before it and the whole chain replays from the
cache, in `--mode replay` too. The link's key is signed over the tenant, so one tenant
can neither continue nor probe another's ids.

Links are stored as entries are (sealed, under dg2 keys, first writer wins), so they
expire, export and import with the answers they point at.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.cache.entry import Entry, now_in_ms
from gateway.cache.singleflight import SingleFlight
from gateway.policy.canonical import canonical_json
from gateway.policy.keys import KeyParts, sign

if TYPE_CHECKING:
    from gateway.ingress.auth import Tenant

LINK = "link"  # the finish of a link entry, whose body is the key it points at
_ROUTE = "#answer-id"  # no surface is named so: link keys never meet request keys
_OWNER = "chains"  # a fill-lock owner no one holds: commit then only writes


class Chains:
    MEMO = 4096  # links known stored, so that a hot hit writes nothing and reads no body

    def __init__(self, flights: SingleFlight, secret: bytes) -> None:
        self.flights = flights
        self.secret = secret
        # (tenant, upstream, the entry's key, or for an answer not stored its id): links written
        self._written: dict[tuple[Tenant, str, str], None] = {}

    def known(self, tenant: Tenant, upstream: str, key: str) -> bool:
        """Whether the link of the entry stored under `key` is known stored for `tenant`."""
        return (tenant, upstream, key) in self._written

    def _key(self, tenant: Tenant, upstream: str, answer: str) -> str:
        # The tenant's name as well as its namespace: tenants that share entries still
        # continue only the answers each was served.
        return sign(self.secret, KeyParts(tenant.namespace, upstream, "", _ROUTE, "",
                                          canonical_json([tenant.name, answer])))

    async def served(self, tenant: Tenant, upstream: str, answer: str, key: str, entry: Entry) -> None:
        """Record that `tenant` was served `entry`, whose id is `answer`, stored under `key`
        ("" when it was not stored). The link ages out with the entry (an unstored one's
        as an entry of its model would). Raises StoreError."""
        seen = (tenant, upstream, key or "#" + answer)  # "#": no cache key starts so
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
        link = self._key(tenant, upstream, answer)
        value = Entry(key.encode(), None, entry.model, LINK, expires_ms=expires)
        await self.flights.store.commit(link, self.flights.sealer.seal(link, value), _OWNER,
                                        ttl_ms=expires - now if expires is not None else 0)
        if len(self._written) >= self.MEMO:
            del self._written[next(iter(self._written))]
        self._written[seen] = None

    async def parent(self, tenant: Tenant, upstream: str, answer: str) -> str | None:
        """The key the answer `answer` is stored under ("" for one served unstored); None for
        an id this gateway did not serve `tenant`, or no longer remembers. Raises StoreError."""
        link = self._key(tenant, upstream, answer)
        raw = await self.flights.store.get(link)
        entry = None if raw is None else self.flights.unseal(link, raw)
        if entry is None or entry.finish != LINK or entry.expired():
            return None
        return entry.body.decode()
