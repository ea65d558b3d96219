"""The OpenAI request bodies this server accepts, and its error shape.

Validation is strict (a string is not a number) and complete before anything reaches
the engine. Parameters that OpenAI defines but this backend cannot honour are refused
with a 400 naming the parameter, rather than silently ignored; unknown extra fields
(`user`, `metadata`, ...) are accepted and have no effect.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

INT64 = dict(ge=-(2 ** 63), le=2 ** 63 - 1)


class APIError(Exception):
    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# name -> the values that mean "not used"; anything else is refused.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none"),
    "response_format": (None, {"type": "text"}),
    "suffix": (None, ""),
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)           # an extension (vLLM's): -1 and 0 mean off
    seed: int | None = Field(None, **INT64)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool | None = False                  # an extension (vLLM's), for benchmarks

    @model_validator(mode="before")
    @classmethod
    def refuse_unsupported(cls, data):
        if isinstance(data, dict):
            for name, off in UNSUPPORTED.items():
                if name in data and data[name] not in off:
                    raise APIError(400, f"{name}={data[name]!r} is not supported: this backend only accepts "
                                   f"{name}={off[1]!r}", param=name, code="unsupported_parameter")
        return data

    def stop_list(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > 16:
            raise APIError(400, "at most 16 stop strings", param="stop")
        if any(not s for s in stops):
            raise APIError(400, "stop strings must not be empty", param="stop")
        return stops


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def for_template(self) -> dict:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        out = {"role": self.role, "content": content or ""}
        if self.name is not None:
            out["name"] = self.name
        return out


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    prompt_logprobs: int | None = Field(None, ge=0, le=20)   # an extension (vLLM's)

    @model_validator(mode="after")
    def top_needs_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise APIError(400, "top_logprobs requires logprobs to be true", param="top_logprobs")
        return self


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0)   # 0 scores the prompt (with echo or prompt_logprobs)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool | None = False                       # the prompt leads the text (and its logprobs the logprobs)
    prompt_logprobs: int | None = Field(None, ge=0, le=20)   # an extension (vLLM's)
    return_tokens_as_token_ids: bool | None = False          # vLLM's: logprobs name tokens "token_id:{id}"

    @model_validator(mode="after")
    def one_prompt(self):
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            if len(self.prompt) != 1:
                raise APIError(400, "only one prompt per request is supported", param="prompt")
            self.prompt = self.prompt[0]
        if self.max_tokens == 0 and not self.echo and self.prompt_logprobs is None:
            raise APIError(400, "max_tokens=0 generates nothing: it is for scoring a prompt, with echo or "
                           "prompt_logprobs", param="max_tokens")
        return self

    def scored_prompt_logprobs(self) -> int | None:
        """How many top prompt logprobs the engine must compute, None for no prompt logprobs."""
        wanted = [k for k in (self.prompt_logprobs, self.logprobs if self.echo else None) if k is not None]
        return max(wanted) if wanted else None


def parse(model: type[BaseModel], body: Any) -> Any:
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        raise APIError(400, f"{param}: {err['msg']}" if param else err["msg"], param=param,
                       code="invalid_value") from None
