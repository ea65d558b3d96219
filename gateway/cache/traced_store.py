"""A store whose lookups and writes are child spans of the request's trace. Installed only
when tracing is on (gateway/ops/tracing.py), so the hit path pays nothing otherwise."""
from __future__ import annotations

from gateway.cache.store_wrapper import StoreWrapper
from gateway.ops import tracing


class TracedStore(StoreWrapper):
    async def get(self, key: str) -> bytes | None:
        with tracing.span("detgate.cache.lookup", {"detgate.key_prefix": key[:tracing.KEY_PREFIX_CHARS]}) as span:
            value = await self.store.get(key)
            if span is not None:
                span.set_attribute("detgate.cache.found", value is not None)
            return value

    async def get_expiring(self, key: str) -> tuple[bytes | None, float | None]:
        with tracing.span("detgate.cache.lookup", {"detgate.key_prefix": key[:tracing.KEY_PREFIX_CHARS]}):
            return await self.store.get_expiring(key)

    async def commit(self, key: str, value: bytes, owner: str, *, overwrite: bool = False, ttl_ms: int = 0) -> bool:
        with tracing.span("detgate.cache.store", {"detgate.key_prefix": key[:tracing.KEY_PREFIX_CHARS]}) as span:
            stored = await self.store.commit(key, value, owner, overwrite=overwrite, ttl_ms=ttl_ms)
            if span is not None:
                span.set_attribute("detgate.cache.stored", stored)
            return stored
