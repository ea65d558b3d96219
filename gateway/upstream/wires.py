"""The wire formats upstreams speak, and how each is sent the caller's credentials.

A surface (gateway/apis) belongs to one wire; a profile says which wire its upstreams
speak natively, which picks the surfaces they serve by default and how the uncached
proxy sends them credentials.
"""
from __future__ import annotations

WIRES = ("openai", "anthropic")


def credential_headers(wire: str, key: str | None) -> tuple[tuple[str, str], ...]:
    """OpenAI's wire takes `Authorization: Bearer`, Anthropic's `x-api-key`."""
    if not key:
        return ()
    return (("x-api-key", key),) if wire == "anthropic" else (("Authorization", f"Bearer {key}"),)
