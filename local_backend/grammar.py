"""Structured outputs: the grammar a request constrains its answer to, and the matchers that
enforce it token by token (llguidance; docs/structured_outputs.md says why that engine).

A grammar is llguidance's JSON text, made on the HTTP side from the request (a JSON schema,
any JSON object, or the model family's tool-call form over the declared tools), checked there
so that a schema the engine cannot compile is a 400 naming the field, and handed to the
engine inside SamplingParams. Both sides compile a grammar once and keep it (Grammars): a
sequence gets a copy of the compiled matcher, so compiling is paid once per schema.
"""
from __future__ import annotations

import collections
import json
import threading

import llguidance

CACHED_GRAMMARS = 256
# Whitespace inside generated JSON: none between tokens of structure, as json.dumps(separators=(",", ":"))
# would not (a schema's own x-guidance settings may still ask for more).
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A request's schema or grammar that cannot be compiled."""


def json_schema(schema: dict) -> str:
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except ValueError as e:
        raise GrammarError(str(e)) from None


def json_object() -> str:
    return json_schema({"type": "object"})


def lark(source: str) -> str:
    return llguidance.LLMatcher.grammar_from_lark(source)


def regex(pattern: str) -> str:
    return llguidance.LLMatcher.grammar_from_regex(pattern)


def choice(options: list[str]) -> str:
    """Exactly one of `options`, as written."""
    return lark("start: " + " | ".join(json.dumps(o, ensure_ascii=False) for o in options) + "\n")


class Grammars:
    """Compiled grammars over one tokenizer, most recently used kept; safe from several threads."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: list[int]):
        self.tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos_ids)
        self.words = -(-vocab_size // 32)   # int32 words of one row's bitmask
        self._compiled: collections.OrderedDict[str, llguidance.LLMatcher] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.compiles = 0   # how many grammars were compiled (not served from the cache)

    def compiled(self, grammar: str) -> llguidance.LLMatcher:
        """The grammar's matcher at its start; raises GrammarError for one that does not compile."""
        with self._lock:
            matcher = self._compiled.get(grammar)
            if matcher is not None:
                self._compiled.move_to_end(grammar)
                return matcher
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(matcher.get_error())
        with self._lock:
            self.compiles += 1
            self._compiled[grammar] = matcher
            while len(self._compiled) > CACHED_GRAMMARS:
                self._compiled.popitem(last=False)
        return matcher

    def matcher(self, grammar: str) -> llguidance.LLMatcher:
        """A matcher of its own for one sequence."""
        return self.compiled(grammar).deep_copy()


def schema_text(schema: dict) -> str:
    """A schema as it is keyed and shown: its members in the order given."""
    return json.dumps(schema, ensure_ascii=False)
