"""The API surfaces the gateway caches, one module per wire format (see surface.py)."""
from __future__ import annotations

from gateway.apis import (
                                                    anthropic_messages,
                                                    chat_completions,
                                                    completions,
                                                    embeddings,
                                                    responses,
)
from gateway.apis.surface import Surface

SURFACES: dict[str, Surface] = {s.name: s for s in (chat_completions.SURFACE, completions.SURFACE, embeddings.SURFACE,
                                                    responses.SURFACE, anthropic_messages.SURFACE)}
