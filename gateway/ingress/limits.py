"""Per-tenant policy beyond authentication: messages per request and rate limits.

Each breach is the client's to fix or wait out, so each is a 4xx in OpenAI's shape: 400
for a request that can never pass, 429 with Retry-After for one that may pass later.
"""
from __future__ import annotations

from typing import Callable

import redis.asyncio as aioredis

from gateway.config import Settings, parse_rate_limit
from gateway.errors import ApiError
from gateway.ingress.ratelimit import (
    Decision,
    Limit,
    LocalRateLimiter,
    RedisRateLimiter,
    retry_after_header,
)
from gateway.ops.metrics import Metrics

DEFAULT_TENANT = "*"


def check_message_count(count: int, max_messages: int) -> None:
    """Pure, so it may run inside the memoized preparation."""
    if count > max_messages:
        raise ApiError(400, f"The request has {count} messages; this gateway accepts at most {max_messages}.",
                       param="messages", code="too_many_messages")


class TenantLimiter:
    """Token buckets per tenant: shared through Redis when a Redis client is given (falling
    back to this process's own buckets while Redis is down), else in this process."""

    def __init__(self, settings: Settings, redis: aioredis.Redis | aioredis.RedisCluster | None,
                 on_redis_error: Callable[[BaseException], object] | None = None) -> None:
        limits = {tenant: Limit(*parse_rate_limit(spec, tenant)) for tenant, spec in settings.rate_limits.items()}
        default = limits.pop(DEFAULT_TENANT, None)
        self._local = LocalRateLimiter(limits, default)
        self._shared = (RedisRateLimiter(redis, self._local, timeout=settings.store_timeout_s,
                                         on_redis_error=on_redis_error) if redis is not None else None)

    async def check(self, tenant: str) -> Decision:
        if self._shared is not None:
            return await self._shared.check(tenant)
        return self._local.check(tenant)


def rate_limited(tenant: str, decision: Decision) -> ApiError:
    return ApiError(429, f"Rate limit of tenant {tenant!r} reached; retry in {decision.retry_after:.2f}s.",
                    type="rate_limit_error", code="rate_limit_exceeded",
                    headers={"Retry-After": retry_after_header(decision.retry_after)})


async def admit(limiter: TenantLimiter, tenant: str, metrics: Metrics) -> None:
    """Raises the 429 when `tenant` is over its rate limit."""
    decision = await limiter.check(tenant)
    if not decision.allowed:
        metrics.rate_limited.labels(tenant).inc()
        raise rate_limited(tenant, decision)
