"""Request validation: enough of each wire's schema to reject what no upstream would
accept, with an error that names the offending parameter.

Only validated, never rewritten: unknown fields pass on (a new upstream parameter must
keep working, and it stays part of the cache key). Each surface declares its pydantic
model from the pieces here and validates with `check`.
"""
from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
)

from gateway.errors import ApiError

Number = Union[StrictInt, StrictFloat]


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Sampling(Open):
    """What chat and text completions share."""

    model: Annotated[StrictStr, Field(min_length=1)]
    stream: StrictBool | None = None
    n: Annotated[StrictInt, Field(ge=1, le=128)] | None = None
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = None
    top_p: Annotated[Number, Field(ge=0, le=1)] | None = None
    seed: StrictInt | None = None
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    stop: StrictStr | list[StrictStr] | None = None


Tokens = list[StrictInt]


def check(adapter: TypeAdapter, body: Any) -> None:
    """Raises ApiError (400) naming the first offending parameter."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.", code="invalid_body")
    try:
        adapter.validate_python(body)
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
