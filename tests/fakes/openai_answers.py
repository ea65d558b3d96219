"""What the fake provider's answers hold, whole and streamed, field by field as OpenAI sends them.

A chat answer is one of: text (with per-token logprobs when asked), a refusal, tool calls
(their arguments streamed in pieces), or audio (`modalities: ["text", "audio"]`): a
transcript and base64 PCM data, streamed as gpt-4o-audio-preview does it (transcript
pieces before the role chunk, the audio id with the first data piece, each data piece
encoded on its own, and a last `expires_at`-only delta with no finish_reason). A text
completion is text with the legacy logprobs object. Every random draw comes from the
caller's generator, so texts, ids, audio and chunking differ on every call.
"""
from __future__ import annotations

import base64
import random
import secrets
import time
from dataclasses import dataclass
from typing import Any, Callable

Pieces = Callable[[str], list[str]]


@dataclass
class Choice:
    index: int
    text: str
    finish: str | None  # None: the choice never finishes (a stream cut short by the provider)
    kind: str = "text"  # "text", "refusal", "tools", "audio"
    tools: tuple[str, ...] = ()  # function names called, for kind "tools"
    logprobs: int | None = None  # top_logprobs asked for (0: logprobs without alternatives)
    audio: bytes = b""


def kind_asked(body: dict) -> tuple[str, tuple[str, ...]]:
    """What a chat request makes the model answer with: audio when asked for, a call to the
    tools it must call (tool_choice "required" or a named function), else text."""
    if "audio" in (body.get("modalities") or ()):
        return "audio", ()
    choice = body.get("tool_choice")
    tools = [t["function"]["name"] for t in body.get("tools") or () if t.get("type") == "function"]
    if isinstance(choice, dict):
        return "tools", (choice["function"]["name"],)
    if choice == "required" and tools:
        return "tools", tuple(tools[:1] if body.get("parallel_tool_calls") is False else tools)
    return "text", ()


def _token_logprobs(rng: random.Random, token: str, top: int) -> dict[str, Any]:
    def one(text: str) -> dict[str, Any]:
        return {"token": text, "logprob": -round(rng.random() * 4, 6), "bytes": list(text.encode())}

    return {**one(token), "top_logprobs": [one(token)] + [one(rng.choice("abcdef")) for _ in range(top - 1)]
            if top else []}


def _arguments(rng: random.Random, text: str) -> str:
    return '{"query": "%s", "limit": %d}' % (text, rng.randint(1, 50))


def chat_message(rng: random.Random, choice: Choice) -> dict[str, Any]:
    """The whole answer's choice (non-stream)."""
    message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
    logprobs = None
    if choice.kind == "text":
        message["content"] = choice.text
        if choice.logprobs is not None:
            logprobs = {"content": [_token_logprobs(rng, t, choice.logprobs) for t in _words(choice.text)],
                        "refusal": None}
    elif choice.kind == "refusal":
        message["refusal"] = choice.text
    elif choice.kind == "tools":
        message["tool_calls"] = [{"id": f"call_{secrets.token_hex(8)}", "type": "function",
                                  "function": {"name": name, "arguments": _arguments(rng, choice.text)}}
                                 for name in choice.tools]
    else:
        message["audio"] = {"id": f"audio_{secrets.token_hex(12)}", "data": base64.b64encode(choice.audio).decode(),
                            "expires_at": int(time.time()) + 3600, "transcript": choice.text}
    return {"index": choice.index, "message": message, "logprobs": logprobs, "finish_reason": choice.finish}


def chat_parts(rng: random.Random, choice: Choice, pieces: Pieces) -> list[dict[str, Any]]:
    """The stream's choice parts ({index, delta, logprobs, finish_reason}) for one choice."""
    def part(delta: dict[str, Any], logprobs: Any = None, finish: str | None = None) -> dict[str, Any]:
        return {"index": choice.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    role = {"role": "assistant", "content": None, "refusal": None}
    out: list[dict[str, Any]] = []
    if choice.kind == "text":
        out.append(part({**role, "content": ""}, {"content": [], "refusal": None} if choice.logprobs is not None else None))
        for piece in pieces(choice.text):
            logprobs = None
            if choice.logprobs is not None:
                logprobs = {"content": [_token_logprobs(rng, piece, choice.logprobs)], "refusal": None}
            out.append(part({"content": piece}, logprobs))
    elif choice.kind == "refusal":
        out.append(part({**role, "refusal": ""}))
        out += [part({"refusal": piece}) for piece in pieces(choice.text)]
    elif choice.kind == "tools":
        for i, name in enumerate(choice.tools):
            call = {"index": i, "id": f"call_{secrets.token_hex(8)}", "type": "function",
                    "function": {"name": name, "arguments": ""}}
            out.append(part({**(role if i == 0 else {}), "tool_calls": [call]}))
            out += [part({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
                    for piece in pieces(_arguments(rng, choice.text))]
    else:
        out += _audio_parts(rng, choice, pieces, part, role)
    if choice.finish is not None and not (choice.kind == "audio" and choice.finish == "stop"):
        out.append(part({}, None, choice.finish))
    return out


def _audio_parts(rng: random.Random, choice: Choice, pieces: Pieces, part, role) -> list[dict[str, Any]]:
    transcript = pieces(choice.text)
    data, at = [], 0
    while at < len(choice.audio):
        step = 2 * rng.randint(1, 40)  # whole PCM16 samples; each piece base64-encoded alone, padding and all
        data.append(base64.b64encode(choice.audio[at:at + step]).decode())
        at += step
    out = [part({"audio": {"transcript": transcript.pop(0)}})] if transcript else []
    out.append(part({**role, "audio": {"id": f"audio_{secrets.token_hex(12)}", "data": data.pop(0)}}))
    while transcript or data:
        delta: dict[str, Any] = {}
        if transcript and rng.random() < 0.5:
            delta["transcript"] = transcript.pop(0)
        if data and (not delta or rng.random() < 0.5):
            delta["data"] = data.pop(0)
        if not delta:
            delta["transcript"] = transcript.pop(0)
        out.append(part({"audio": delta}))
    if choice.finish is None:
        return out
    # The end of the audio: its expiry, where a complete answer has no finish_reason
    # (gpt-4o-audio-preview; openai-node#1206).
    return out + [{"index": choice.index, "delta": {"audio": {"expires_at": int(time.time()) + 3600}}}]


def completion_choice(rng: random.Random, choice: Choice) -> dict[str, Any]:
    logprobs = None
    if choice.logprobs is not None:
        logprobs = _completion_logprobs(rng, _words(choice.text), 0, choice.logprobs)
    return {"index": choice.index, "text": choice.text, "logprobs": logprobs, "finish_reason": choice.finish}


def completion_parts(rng: random.Random, choice: Choice, pieces: Pieces) -> list[dict[str, Any]]:
    out, offset = [], 0
    for piece in pieces(choice.text):
        logprobs = None
        if choice.logprobs is not None:
            logprobs = _completion_logprobs(rng, [piece], offset, choice.logprobs)
        out.append({"index": choice.index, "text": piece, "logprobs": logprobs, "finish_reason": None})
        offset += len(piece)
    if choice.finish is not None:
        out.append({"index": choice.index, "text": "", "logprobs": None, "finish_reason": choice.finish})
    return out


def _completion_logprobs(rng: random.Random, tokens: list[str], offset: int, top: int) -> dict[str, Any]:
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {"tokens": tokens, "token_logprobs": [-round(rng.random() * 4, 6) for _ in tokens],
            "top_logprobs": [{t: -round(rng.random(), 6)} for t in tokens] if top else None,
            "text_offset": offsets}


def _words(text: str) -> list[str]:
    """A text as tokens that join back to it: each word with the space before it."""
    words = text.split(" ")
    return [words[0]] + [" " + w for w in words[1:]] if text else []
