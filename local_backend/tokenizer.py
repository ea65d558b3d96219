"""tokenizer.json through `tokenizers`, and the chat template from tokenizer_config.json.

The template is rendered the way transformers renders it: a sandboxed jinja2
environment with trim_blocks/lstrip_blocks, the loopcontrols extension, a `tojson`
that keeps non-ASCII text, and the variables templates expect (`raise_exception`,
`strftime_now`, `bos_token`, `eos_token`, `add_generation_prompt`, `tools` and
`documents` as given, and the request's chat_template_kwargs).
"""
from __future__ import annotations

import datetime
import json
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.sandbox
from tokenizers import Tokenizer as HFTokenizer

from local_backend.errors import CheckpointError


# What transformers appends to the final message to find where it ends once rendered
# (continue_final_message): the rendered text is cut there.
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
NO_TEMPLATE = ("this model has no chat template (no chat_template in tokenizer_config.json, no "
               "chat_template.jinja); use /v1/completions")


class TemplateError(ValueError):
    """The chat template refused the conversation (raise_exception, or a jinja error)."""


def _raise_exception(message):
    raise TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _special(value) -> str | None:
    """tokenizer_config.json writes special tokens as strings or as AddedToken dicts."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


def compile_template(source: str) -> jinja2.Template:
    return _environment().from_string(source)


def template_variables(source: str) -> set[str]:
    """The variables a template reads from its caller (`tools`, `documents`, ...)."""
    return jinja2.meta.find_undeclared_variables(_environment().parse(source))


class Tokenizer:
    def __init__(self, path: str | Path, chat_template: str | Path | None = None):
        path = Path(path)
        file = path / "tokenizer.json"
        if not file.exists():
            raise CheckpointError(f"{file}: no such file (only the fast tokenizer format is read)")
        try:
            self.tok = HFTokenizer.from_file(str(file))
        except Exception as e:   # the tokenizers library raises its own exception types
            raise CheckpointError(f"{file}: not a tokenizer ({e})") from None
        config_file = path / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.exists() else {}
        self.bos_token = _special(config.get("bos_token"))
        self.eos_token = _special(config.get("eos_token"))
        source, where = config.get("chat_template"), f"{config_file}: chat_template"
        if isinstance(source, list):  # named templates: the "default" one serves chat
            source = {t["name"]: t["template"] for t in source}.get("default")
            where += "[default]"
        if (path / "chat_template.jinja").exists():
            source, where = (path / "chat_template.jinja").read_text(), str(path / "chat_template.jinja")
        if chat_template is not None:   # the operator's (--chat-template), over the checkpoint's
            source, where = Path(chat_template).read_text(), str(chat_template)
        self.template_source = source
        try:
            self.template = compile_template(source) if source else None
            self.renders = template_variables(source) if source else set()
        except jinja2.TemplateSyntaxError as e:
            raise CheckpointError(f"{where}: the chat template does not compile (line {e.lineno}: {e})") from None

    def check_vocab(self, vocab_size: int) -> None:
        """Refuse a tokenizer that can produce ids the model (config.json's vocab_size) has no embedding for."""
        biggest = max(self.tok.get_vocab(with_added_tokens=True).values(), default=-1)
        if biggest >= vocab_size:
            raise CheckpointError(f"tokenizer.json: token id {biggest} is past config.json vocab_size {vocab_size}")

    @property
    def eos_token_id(self) -> int | None:
        return None if self.eos_token is None else self.tok.token_to_id(self.eos_token)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None,
                    documents: list[dict] | None = None, variables: dict | None = None,
                    continue_final: bool = False) -> str:
        """continue_final (vLLM's continue_final_message): the text ends inside the last message,
        which the model goes on writing, cut where transformers cuts it."""
        if self.template is None:
            raise TemplateError(NO_TEMPLATE)
        final = messages[-1].get("content") if continue_final else None
        if continue_final:
            if not isinstance(final, str) or "content" not in self.template_source:
                raise TemplateError("continue_final_message: the final message has no text the template renders")
            messages = messages[:-1] + [{**messages[-1], "content": final + CONTINUE_TAG}]
        try:
            text = self.template.render(
                **(variables or {}), messages=messages, tools=tools, documents=documents,
                add_generation_prompt=add_generation_prompt, bos_token=self.bos_token or "",
                eos_token=self.eos_token or "")
        except TemplateError:
            raise
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template failed: {e}") from e
        if not continue_final:
            return text
        if final.strip() not in text or CONTINUE_TAG.strip() not in text:
            raise TemplateError("continue_final_message: the chat template does not keep the final message as sent")
        at = text.rindex(CONTINUE_TAG.strip())
        return text[:at] if text[at:at + len(CONTINUE_TAG)] == CONTINUE_TAG else text[:at].rstrip()

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_chat(self, messages: list[dict], **render) -> list[int]:
        # The template already writes any BOS it wants, as transformers' apply_chat_template assumes.
        return self.encode(self.render_chat(messages, **render), add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        """A single token as it would print alone (special tokens included)."""
        return self.tok.decode([token_id], skip_special_tokens=False)
