"""Server-sent events: reading an upstream's stream, and writing the frames clients are sent.

Every surface streams SSE: OpenAI's chat and completions as bare `data:` frames ending in
`data: [DONE]`, the Responses and Anthropic APIs with an `event:` line naming each frame.
"""
from __future__ import annotations

from typing import AsyncIterator

import aiohttp


def frame(payload: bytes, event: str | None = None) -> bytes:
    """One event as sent: its `event:` line when it has a name, its payload on one `data:` line."""
    named = b"event: " + event.encode() + b"\n" if event is not None else b""
    return named + b"data: " + payload + b"\n\n"


async def payloads(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """Event payloads: `data:` lines joined by newlines, an event ending at a blank line."""
    lines: list[bytes] = []
    async for raw in content:
        line = raw.rstrip(b"\r\n")
        if not line:
            if lines:
                yield b"\n".join(lines)
                lines = []
        elif line.startswith(b"data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(b" ") else value)
    if lines:
        yield b"\n".join(lines)
