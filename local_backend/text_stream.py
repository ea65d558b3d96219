"""Token ids in, text out, one token at a time, with stop strings.

Text is decoded incrementally as a difference of two decodes over a short window
(the window starts a token early so that decoders which treat a leading space or a
partial UTF-8 sequence specially treat both decodes alike). A token that ends inside
a multi-byte character yields nothing until the character completes (or generation
ends, when the decoder's replacement character is emitted as a full decode would). The tail that
could still grow into a stop string is held back, so a stop string split across
tokens is caught and never returned. Streaming and non-streaming responses both
concatenate what push() and flush() return, so they are equal by construction.
"""
from __future__ import annotations

from typing import Callable


class TextStream:
    def __init__(self, decode: Callable[[list[int]], str], stops: list[str], context: list[int] = ()):
        self.decode = decode
        self.stops = [s for s in stops if s]
        self.longest = max((len(s) for s in self.stops), default=0)
        self.ids = list(context)            # a few prompt tokens: the first token decodes in context
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""                       # all text decoded so far
        self.emitted = 0                     # how much of it has been returned
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Append a token; return the text that became safe to emit."""
        if self.stopped:
            return ""
        self.ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end of generation: what was held back, an unfinished character included."""
        return "" if self.stopped else self._advance(final=True)

    def _advance(self, final: bool) -> str:
        before = self.decode(self.ids[self.prefix_offset:self.read_offset])
        after = self.decode(self.ids[self.prefix_offset:])
        if len(after) > len(before) and (final or not after.endswith("\ufffd")):
            scanned = len(self.text)
            self.text += after[len(before):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            if self._cut_at_stop(max(0, scanned - self.longest + 1)):
                return self._take(len(self.text))
        return self._take(len(self.text) if final else len(self.text) - self._held_back())

    def _cut_at_stop(self, start: int) -> bool:
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if hits:
            self.text = self.text[:min(hits)]
            self.stopped = True
        return self.stopped

    def _held_back(self) -> int:
        """Length of the longest tail of the text that begins some stop string."""
        for k in range(min(self.longest - 1, len(self.text) - self.emitted), 0, -1):
            tail = self.text[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return k
        return 0

    def _take(self, end: int) -> str:
        out = self.text[self.emitted:end]
        self.emitted = max(self.emitted, end)
        return out
