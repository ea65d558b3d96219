"""The OpenAI request bodies this server accepts, and its error shape.

Validation is strict (a string is not a number) and complete before anything reaches
the engine. The fields a request may hold are an allow-list: those the backend implements,
those that cannot change an answer (NO_EFFECT: `user`, `metadata`, ...), and those it
implements only at their neutral value (UNSUPPORTED); anything else is a 400 naming it, so
that no parameter a client sends (vLLM's `repetition_penalty`, `guided_json`, ...) is silently
ignored.
"""
from __future__ import annotations

import json
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
    "functions": (None, []),
    "function_call": (None, "none"),
    "suffix": (None, ""),
    "include_stop_str_in_output": (None, False),
    "skip_special_tokens": (None, True),
    "modalities": (None, ["text"]),
}
# Fields that cannot change the tokens of an answer: accepted, and without effect.
NO_EFFECT = frozenset({"user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key",
                       "spaces_between_special_tokens"})


class _Strict(BaseModel):
    """A closed request object: wrong types are not coerced and unknown fields are a 400."""
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    include_usage: bool = False


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs` (the newer form of its guided_* fields): one of them."""
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)
    json_: dict | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = Field(None, min_length=1)
    json_object: bool | None = None


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
    min_tokens: int | None = Field(None, ge=0)       # an extension (vLLM's): end-of-sequence banned before
    min_p: float | None = Field(None, ge=0, le=1)    # an extension (vLLM's): a floor relative to the likeliest
    repetition_penalty: float | None = Field(None, gt=0, le=10)   # an extension (vLLM's); 1: off
    # vLLM's guided decoding: the answer held to a JSON schema, a regex or one of some strings
    guided_json: dict | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = Field(None, min_length=1)
    structured_outputs: StructuredOutputs | None = None

    def guided(self) -> tuple[str, str, Any] | None:
        """(field, kind, value) of the vLLM-style constraint asked, if any: at most one."""
        asked = [(f"guided_{kind}", kind, getattr(self, f"guided_{kind}")) for kind in ("json", "regex", "choice")]
        if self.structured_outputs is not None:
            so = self.structured_outputs
            asked += [("structured_outputs.json", "json", so.json_), ("structured_outputs.regex", "regex", so.regex),
                      ("structured_outputs.choice", "choice", so.choice),
                      ("structured_outputs.json_object", "json_object", so.json_object or None)]
        asked = [a for a in asked if a[2] is not None]
        if len(asked) > 1:
            raise APIError(400, f"{asked[0][0]} and {asked[1][0]} both constrain the answer; send one",
                           param=asked[1][0])
        return asked[0] if asked else None
    @model_validator(mode="before")
    @classmethod
    def refuse_unsupported(cls, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(cls.model_fields) - NO_EFFECT - set(UNSUPPORTED))
            if unknown:
                raise APIError(400, f"unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: "
                               f"this backend does not implement {'them' if len(unknown) > 1 else 'it'}",
                               param=unknown[0], code="unknown_parameter")
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


# Message fields that say nothing a template renders: accepted when empty (SDKs echo an
# assistant message back with them), refused otherwise.
MESSAGE_EMPTY_ONLY = ("refusal", "annotations", "audio", "function_call")


class FunctionCall(_Strict):
    name: str
    arguments: str


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None      # an assistant's earlier calls
    tool_call_id: str | None = None               # a tool result's call
    reasoning_content: str | None = None          # an earlier turn's thinking, for templates that render it

    @model_validator(mode="after")
    def known_fields(self):
        for name, value in (self.model_extra or {}).items():
            if name not in MESSAGE_EMPTY_ONLY or value not in (None, [], ""):
                raise APIError(400, f"message field {name} is not supported by this backend", param=name,
                               code="unknown_parameter")
        return self

    def for_template(self) -> dict:
        """The message as chat templates read it (transformers' apply_chat_template form); a
        call's arguments as the object they encode, as templates print them with tojson."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        out = {"role": self.role, "content": content or ""}
        for field in ("name", "tool_call_id", "reasoning_content"):
            if getattr(self, field) is not None:
                out[field] = getattr(self, field)
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": _arguments(c.function.arguments)}} for c in self.tool_calls]
        return out


def _arguments(text: str):
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


class FunctionDef(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Strict):
    name: str
    description: str | None = None
    schema_: dict | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def schema_with_its_type(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise APIError(400, "response_format.json_schema is required with type json_schema, and only then",
                           param="response_format.json_schema")
        return self


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    prompt_logprobs: int | None = Field(None, ge=0, le=20)   # an extension (vLLM's)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    # vLLM's template extensions: whether to open the assistant's turn, variables the
    # template reads (Qwen3's enable_thinking), documents for templates that render them
    add_generation_prompt: bool | None = True
    continue_final_message: bool | None = False
    chat_template_kwargs: dict | None = None
    documents: list[dict] | None = None

    @model_validator(mode="after")
    def consistent(self):
        if self.top_logprobs and not self.logprobs:
            raise APIError(400, "top_logprobs requires logprobs to be true", param="top_logprobs")
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise APIError(400, "tools: two tools have the same name", param="tools")
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise APIError(400, f"tool_choice names the function {choice.function.name!r}, which is not among "
                           f"the tools declared ({', '.join(names) or 'none'})", param="tool_choice")
        if choice == "required" and not names:
            raise APIError(400, "tool_choice 'required' needs at least one tool", param="tool_choice")
        if self.continue_final_message and self.add_generation_prompt is not False:
            raise APIError(400, "continue_final_message needs add_generation_prompt false: the model goes on writing "
                           "the last message rather than starting a new one", param="continue_final_message")
        formatted = self.response_format is not None and self.response_format.type != "text"
        if self.guided() is not None and (formatted or self.calls_tools()):
            raise APIError(400, f"{self.guided()[0]} with response_format or tools: send one constraint",
                           param=self.guided()[0])
        if self.tools and formatted and choice != "none":
            raise APIError(400, "response_format with tools is not supported: a constrained answer cannot also "
                           "call a tool (set tool_choice to 'none')", param="response_format")
        return self

    def calls_tools(self) -> bool:
        """Whether tool calls are parsed out of the answer."""
        return bool(self.tools) and self.tool_choice != "none"


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
