"""Request validation for the cached routes: enough of OpenAI's schema to reject what no
upstream would accept, with an error that names the offending parameter.

Only validated, never rewritten: unknown fields pass on (a new upstream parameter must
keep working, and it stays part of the cache key).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, TypeAdapter, ValidationError

from gateway.errors import ApiError

Number = Union[StrictInt, StrictFloat]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ContentPart(_Open):
    type: StrictStr


class Message(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: StrictStr | list[ContentPart] | None = None


class _Sampling(_Open):
    model: Annotated[StrictStr, Field(min_length=1)]
    stream: StrictBool | None = None
    n: Annotated[StrictInt, Field(ge=1, le=128)] | None = None
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = None
    top_p: Annotated[Number, Field(ge=0, le=1)] | None = None
    seed: StrictInt | None = None
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    stop: StrictStr | list[StrictStr] | None = None


class ChatRequest(_Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None


Tokens = list[StrictInt]


class CompletionRequest(_Sampling):
    prompt: StrictStr | list[StrictStr] | Tokens | list[Tokens]


class EmbeddingRequest(_Open):
    model: Annotated[StrictStr, Field(min_length=1)]
    input: StrictStr | list[StrictStr] | Tokens | list[Tokens]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[StrictInt, Field(ge=1)] | None = None


_ADAPTERS = {
    "chat.completions": TypeAdapter(ChatRequest),
    "completions": TypeAdapter(CompletionRequest),
    "embeddings": TypeAdapter(EmbeddingRequest),
}


def validate(route: str, body: Any) -> None:
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.", code="invalid_body")
    try:
        _ADAPTERS[route].validate_python(body)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        param = _param(error["loc"])
        raise ApiError(400, f"Invalid value for '{param}': {error['msg']}.", param=param,
                       code="missing_required_parameter" if error["type"] == "missing" else "invalid_value") from None


def _param(loc: tuple[Any, ...]) -> str:
    # Union members appear in pydantic's loc (e.g. "str", "list[...]"): the client never named them.
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not any(c in part for c in "[]") and part not in ("str", "int", "float", "bool", "none", "function-after"):
            out += f".{part}" if out else part
    return out
