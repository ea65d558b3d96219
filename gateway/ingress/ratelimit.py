"""Per-tenant rate limits: a token bucket, in-process or shared by all replicas via Redis.

A bucket holds up to `burst` tokens and refills at `rate` tokens per second; a request
takes one. When the bucket is short, the answer is how long until it is not, which the
handler sends as a 429 with Retry-After.

Across replicas the same bucket lives in Redis, updated by one small Lua script. We chose
that over an INCR+PEXPIRE fixed window because (1) it has exactly the semantics of the
in-process bucket, so turning on Redis does not change what a limit means; (2) a fixed
window lets through up to twice the limit across a window boundary; (3) the script is
atomic in one round trip and touches one key, so it runs unchanged on Redis Cluster;
(4) it reads the time from Redis itself, so replicas with skewed clocks agree.

If Redis fails, the limiter fails open to the in-process bucket: each replica still
enforces the limit on its own traffic, and no request waits on a dead Redis for longer
than `timeout`.
"""
from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Callable, Mapping

import redis.asyncio as aioredis
import redis.exceptions

Clock = Callable[[], float]


@dataclass(frozen=True)
class Limit:
    rate: float  # tokens per second
    burst: float  # bucket size: requests allowed at once after a quiet period

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")


@dataclass(frozen=True)
class Decision:
    allowed: bool
    retry_after: float  # seconds until the request would be allowed; 0 when allowed
    source: str  # "none" (no limit), "local", "redis", or "fallback" (Redis failed)


def retry_after_header(seconds: float) -> str:
    """Retry-After takes whole seconds: round up, and never say 0 to a refused client."""
    return str(max(1, math.ceil(seconds)))


class TokenBucket:
    def __init__(self, limit: Limit, now: float):
        self.limit = limit
        self._tokens = limit.burst
        self._stamp = now

    def take(self, now: float, cost: float = 1.0) -> float:
        """Take `cost` tokens if there are enough: returns 0, else the seconds to wait."""
        rate, burst = self.limit.rate, self.limit.burst
        self._tokens = min(burst, self._tokens + max(0.0, now - self._stamp) * rate)
        self._stamp = now
        if self._tokens >= cost:
            self._tokens -= cost
            return 0.0
        return (cost - self._tokens) / rate

    def full_by(self) -> float:
        """The instant the bucket is full again: from then on it equals a fresh one."""
        return self._stamp + (self.limit.burst - self._tokens) / self.limit.rate


class LocalRateLimiter:
    """Token buckets per tenant in this process.

    Buckets that have refilled completely are dropped (a fresh bucket is identical), so
    memory follows the number of recently active tenants, not all tenants ever seen.
    """

    def __init__(
        self,
        limits: Mapping[str, Limit],
        default: Limit | None = None,
        clock: Clock = time.monotonic,
        prune_every: int = 1024,
    ):
        self._limits = dict(limits)
        self._default = default
        self._clock = clock
        self._prune_every = prune_every
        self._buckets: dict[str, TokenBucket] = {}
        self._since_prune = 0

    def limit_for(self, tenant: str) -> Limit | None:
        return self._limits.get(tenant, self._default)

    def check(self, tenant: str, cost: float = 1.0) -> Decision:
        limit = self.limit_for(tenant)
        if limit is None:
            return Decision(True, 0.0, "none")
        now = self._clock()
        self._maybe_prune(now)
        bucket = self._buckets.get(tenant)
        if bucket is None or bucket.limit != limit:
            bucket = self._buckets[tenant] = TokenBucket(limit, now)
        wait = bucket.take(now, cost)
        return Decision(wait == 0.0, wait, "local")

    def __len__(self) -> int:
        return len(self._buckets)

    def _maybe_prune(self, now: float) -> None:
        self._since_prune += 1
        if self._since_prune < self._prune_every:
            return
        self._since_prune = 0
        for tenant in [t for t, b in self._buckets.items() if b.full_by() <= now]:
            del self._buckets[tenant]


# KEYS[1] bucket hash {t: tokens, ts: microseconds}; ARGV rate/s, burst, cost.
# Returns the wait in seconds as a string (Lua numbers become integers in replies).
# The key expires when the bucket would be full, which is the same as not existing.
_BUCKET_LUA = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local s = redis.call('HMGET', KEYS[1], 't', 'ts')
local tokens = tonumber(s[1])
local stamp = tonumber(s[2])
if tokens == nil or stamp == nil then
  tokens = burst
  stamp = now
end
tokens = math.min(burst, tokens + math.max(0, now - stamp) * rate / 1000000)
local wait = 0
if tokens >= cost then
  tokens = tokens - cost
else
  wait = (cost - tokens) / rate
end
-- %d, not tostring: tostring keeps 14 digits, and a timestamp in microseconds has 16.
redis.call('HSET', KEYS[1], 't', tostring(tokens), 'ts', string.format('%d', now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1)
return tostring(wait)
"""

# What counts as "Redis is unavailable" (fail open) rather than a bug (raise).
REDIS_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
              redis.exceptions.ClusterDownError, redis.exceptions.BusyLoadingError,
              redis.exceptions.TryAgainError, OSError, TimeoutError)


class RedisRateLimiter:
    """The same token buckets, shared by every replica through Redis (or Redis Cluster).

    `client` is a redis.asyncio Redis or RedisCluster. Keys are `{prefix}{tenant}`; the
    tenant is wrapped in a hash tag so a cluster keeps each bucket on one slot.
    """

    def __init__(
        self,
        client: aioredis.Redis | aioredis.RedisCluster,
        fallback: LocalRateLimiter,
        prefix: str = "detgate:rl:",
        timeout: float = 0.25,
        on_redis_error: Callable[[BaseException], object] | None = None,
    ):
        self._client = client
        self._fallback = fallback
        self._prefix = prefix
        self._timeout = timeout
        self._on_redis_error = on_redis_error
        self._script = client.register_script(_BUCKET_LUA)

    def key(self, tenant: str) -> str:
        return f"{self._prefix}{{{tenant}}}"

    async def check(self, tenant: str, cost: float = 1.0) -> Decision:
        limit = self._fallback.limit_for(tenant)
        if limit is None:
            return Decision(True, 0.0, "none")
        try:
            async with asyncio.timeout(self._timeout):
                reply = await self._script(keys=[self.key(tenant)], args=[limit.rate, limit.burst, cost])
        except REDIS_DOWN as exc:
            if self._on_redis_error is not None:
                self._on_redis_error(exc)
            local = self._fallback.check(tenant, cost)
            return Decision(local.allowed, local.retry_after, "fallback")
        wait = float(reply)
        return Decision(wait == 0.0, wait, "redis")
