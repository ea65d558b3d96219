"""The anthropic SDK against a gateway whose upstreams are the fake OpenAI provider
(`fake`) and the fake Anthropic provider (`claude`, profile anthropic), shared by the
test_anthropic_* tests."""
from __future__ import annotations

import anthropic
import orjson

MODEL = "claude-sonnet-4-6"  # takes temperature or top_p, never both (the fake checks, as the API does)
MESSAGES = [{"role": "user", "content": "Tell me a story."}]
BODY = {"model": MODEL, "max_tokens": 64, "messages": MESSAGES}
# As the SDK sends them, so that plain HTTP and SDK requests share entries (the version is keyed).
HEADERS = {"x-api-key": "client-key", "anthropic-version": anthropic._constants.ANTHROPIC_API_VERSION}
WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                            "required": ["city", "unit"], "additionalProperties": False}}


def upstreams(upstream, claude) -> list:
    return [f"fake={upstream[1]}", {"name": "claude", "url": claude[1], "profile": "anthropic", "api_key": "sk-op"}]


def sdk(base: str, **kwargs) -> anthropic.Anthropic:
    """The official client for the gateway at `base`, without its own retries."""
    return anthropic.Anthropic(base_url=base, api_key=kwargs.pop("api_key", "unused"), max_retries=0, **kwargs)


def same(a: anthropic.types.Message, b: anthropic.types.Message) -> bool:
    """Whether two parsed messages say the same (a stream helper's has parsing extras)."""
    return a.to_dict(exclude_none=True) == anthropic.types.Message.construct(**b.to_dict()).to_dict(exclude_none=True)


def events(raw: bytes) -> list[tuple[str, dict]]:
    """(event name, payload) of each SSE event in a stream's bytes."""
    out = []
    for chunk in raw.split(b"\n\n"):
        if not chunk:
            continue
        lines = dict(line.split(b": ", 1) for line in chunk.split(b"\n"))
        out.append((lines[b"event"].decode(), orjson.loads(lines[b"data"])))
    return out
