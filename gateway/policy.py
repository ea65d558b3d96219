"""The policy hook between routing and canonicalization.

This is where an upstream's profile will de-randomize sampling parameters and choose a
strategy; until profiles are plugged in, requests go through unchanged.
"""
from __future__ import annotations

from gateway.config import UpstreamConfig


def apply_policy(route: str, body: dict, upstream: UpstreamConfig) -> tuple[dict, tuple[str, ...]]:
    """(the body to canonicalize and send, warnings for x-detgate-warnings)."""
    return body, ()
