"""OpenAI (legacy) Completions (`POST /v1/completions`): prompts in, text choices out."""
from __future__ import annotations

from typing import Any, Iterator

import orjson
from pydantic import StrictStr, TypeAdapter

from gateway.apis import choices
from gateway.apis.surface import Recorder, as_dict, input_texts
from gateway.apis.validation import Sampling, Tokens
from gateway.cache.entry import Entry
from gateway.policy import canonical as c
from gateway.upstream.sse import frame


class CompletionRequest(Sampling):
    prompt: StrictStr | list[StrictStr] | Tokens | list[Tokens]


_REQUEST = TypeAdapter(CompletionRequest)
# The request body as the gateway knows it (see canonical.py); a member not listed is kept exactly as sent.
_FIELDS = c.Fields(
    {"model": c.plain, "prompt": c.inputs, "suffix": c.text_field, "stop": c.stop, "best_of": c.plain,
     "echo": c.plain, "frequency_penalty": c.number, "logit_bias": c.numbers, "logprobs": c.plain,
     "max_tokens": c.plain, "n": c.plain, "presence_penalty": c.number, "seed": c.plain, "temperature": c.number,
     "top_k": c.number, "top_p": c.number},
    nullable=frozenset({
        "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
        "presence_penalty", "seed", "stop", "suffix", "temperature", "top_k", "top_p",
    }),
    # Documented defaults, the same on every OpenAI-compatible server (logprobs here is a count: none is its default).
    defaults={"n": 1, "best_of": 1, "echo": False, "stop": [], "frequency_penalty": 0, "presence_penalty": 0},
)


def _new_choice(index: int) -> dict[str, Any]:
    return {"index": index, "text": "", "logprobs": None, "finish_reason": None}


def _add(choice: dict[str, Any], part: dict[str, Any]) -> None:
    choices.merge(choice, {k: v for k, v in part.items() if k not in ("index", "finish_reason", "logprobs")})
    choices.add_tail(choice, part)


class Completions(choices.ChoicesSurface):
    name = "completions"
    path = "/completions"
    request = _REQUEST
    fields = _FIELDS

    def texts(self, body: dict) -> Iterator[tuple[str, str]]:
        return input_texts(body, "prompt")

    def from_body(self, upstream: str, payload: bytes) -> Entry:
        parsed = orjson.loads(payload)
        found = choices.check_answer(upstream, parsed, payload)
        head = choices.head(parsed, "text_completion")
        stream = b"".join(frame(orjson.dumps({**head, "choices": [choice]})) for choice in found)
        return Entry(payload, stream, str(parsed.get("model") or ""), choices.finish_class(found),
                     choices.usage_frame(parsed, "text_completion"))

    def recorder(self, upstream: str) -> Recorder:
        return choices.ChoicesRecorder(upstream, "text_completion", "text_completion", _add, _new_choice)

    def answer_parts(self, parsed: dict) -> list:
        found = parsed.get("choices")
        return [as_dict(choice).get("text") for choice in (found if isinstance(found, list) else ())]

    def answer_text(self, response: dict) -> str:
        found = response.get("choices")
        first = as_dict(found[0]) if isinstance(found, list) and found else {}
        return str(first.get("text", ""))


SURFACE = Completions()
