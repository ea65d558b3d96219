"""OpenAI Embeddings (`POST /v1/embeddings`): no sampling, no stream."""
from __future__ import annotations

from typing import Annotated, Iterator, Literal

import orjson
from pydantic import Field, StrictInt, StrictStr, TypeAdapter

from gateway.apis.surface import NotAnAnswer, Surface, View, input_texts
from gateway.apis.validation import Open, Tokens
from gateway.cache.entry import Entry
from gateway.errors import UpstreamError
from gateway.policy import canonical as c


class EmbeddingRequest(Open):
    model: Annotated[StrictStr, Field(min_length=1)]
    input: StrictStr | list[StrictStr] | Tokens | list[Tokens]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[StrictInt, Field(ge=1)] | None = None


_REQUEST = TypeAdapter(EmbeddingRequest)
# The request body as the gateway knows it (see canonical.py); a member not listed is kept
# exactly as sent. encoding_format is keyed as sent: the openai SDK asks for base64 unless
# told otherwise, and a float answer is other bytes.
_FIELDS = c.Fields({"model": c.plain, "input": c.inputs, "encoding_format": c.plain, "dimensions": c.plain},
                   nullable=frozenset({"dimensions", "encoding_format"}))


class Embeddings(Surface):
    name = "embeddings"
    path = "/embeddings"
    request = _REQUEST
    fields = _FIELDS

    def view(self, body: dict) -> View:
        return View()

    def upstream_body(self, sent: dict, stream: bool) -> dict:
        return {k: v for k, v in sent.items() if k not in ("stream", "stream_options")}

    def texts(self, body: dict) -> Iterator[tuple[str, str]]:
        return input_texts(body, "input")

    def from_body(self, upstream: str, payload: bytes) -> Entry:
        parsed = orjson.loads(payload)
        if not isinstance(parsed, dict):
            raise NotAnAnswer(upstream, "not a JSON object")
        if parsed.get("error") is not None:
            raise UpstreamError(502, payload)
        data = parsed.get("data")
        if not isinstance(data, list) or not data:
            raise NotAnAnswer(upstream, "no data")
        return Entry(payload, None, str(parsed.get("model") or ""))

    def answer_parts(self, parsed: dict) -> list:
        data = parsed.get("data")
        return [item.get("embedding") if isinstance(item, dict) else None for item in (data if isinstance(data, list) else ())]


SURFACE = Embeddings()
