"""Structured output: what a request's text must match (a JSON schema, any JSON object, a regex,
one of fixed choices, or a Lark grammar), compiled to an llguidance grammar.

The API process builds and validates the grammar when the request arrives (a bad schema is a
400 before anything runs); the engine turns it into a matcher that masks each step's logits to
the tokens that keep the text inside the grammar (`surge/engine/sample/grammar.py`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

KINDS = ("json", "json_object", "regex", "choice", "grammar")
# A reasoning model's thinking before the constrained answer: "" none, "optional" a
# `<think>` ... `</think>` it may write first (Qwen3), "first" thinking it is already in, up to
# `</think>` (DeepSeek-R1; a template that opened it). Free text up to the tag, then the grammar.
THINKING = ("", "optional", "first")
# JSON as json.dumps writes it: free whitespace lets a model (a small one readily) pad its answer
# with newlines and spaces until max_tokens, which a user sees as a hang and truncated JSON. A
# schema's own "x-guidance" options still take precedence over these.
JSON_OPTIONS: Any = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_SPEC_CHARS = 256 * 1024


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """`kind` and its `spec`: a JSON schema as JSON text (json), nothing (json_object), a regex,
    a JSON list of strings (choice), or a Lark grammar (grammar)."""

    kind: str
    spec: str = ""
    thinking: str = ""  # one of THINKING

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"structured output kind must be one of {KINDS}, got {self.kind!r}")
        if self.thinking not in THINKING:
            raise ValueError(f"thinking must be one of {THINKING}, got {self.thinking!r}")
        if len(self.spec) > MAX_SPEC_CHARS:
            raise ValueError(f"structured output spec is over {MAX_SPEC_CHARS} characters")

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str) -> StructuredOutput:
        text = schema if isinstance(schema, str) else json.dumps(schema)
        return cls("json", text)

    @classmethod
    def choice(cls, choices: list[str]) -> StructuredOutput:
        if not choices or not all(isinstance(c, str) and c for c in choices):
            raise ValueError("choice must be a non-empty list of non-empty strings")
        return cls("choice", json.dumps(choices))

    def grammar(self, validate: bool = True) -> str:
        """The llguidance grammar; raises ValueError naming what is wrong. `validate=False`:
        build only, for a caller whose matcher reports errors itself (the engine, after the
        API process validated the request)."""
        import llguidance as llg

        matcher = llg.LLMatcher
        try:
            if self.kind == "json":
                grammar = matcher.grammar_from_json_schema(self.spec, defaults=JSON_OPTIONS)
            elif self.kind == "json_object":
                grammar = matcher.grammar_from_json_schema(
                    {"type": "object"}, defaults=JSON_OPTIONS
                )
            elif self.kind == "regex":
                grammar = matcher.grammar_from_regex(self.spec)
            elif self.kind == "choice":
                choices = json.loads(self.spec)
                grammar = matcher.grammar_from_regex("|".join(re.escape(c) for c in choices))
            else:
                grammar = matcher.grammar_from_lark(self.spec)
        except ValueError as e:
            raise ValueError(f"{self.what()} is not valid: {e}") from None
        if self.thinking:
            grammar = _after_thinking(grammar, self.thinking == "first")
        error = matcher.validate_grammar(grammar) if validate else ""
        if error:
            raise ValueError(f"{self.what()} is not valid: {error.strip()}")
        return grammar

    def what(self) -> str:
        """What the spec is, for an error message: 'the JSON schema', 'the regex'..."""
        return {
            "json": "the JSON schema",
            "json_object": "the JSON object grammar",
            "regex": "the regex",
            "choice": "the choices",
            "grammar": "the grammar",
        }[self.kind]


def _after_thinking(grammar: str, first: bool) -> str:
    """`grammar` (llguidance's JSON, or Lark text) after free thinking that ends at `</think>`
    (and the whitespace after it); `first`: the text starts inside the thinking, else it may
    open with `<think>` or answer at once."""
    try:
        top = json.loads(grammar)
    except ValueError:
        top = {"grammars": [{"lark_grammar": grammar}]}
    top["grammars"][0]["name"] = "answer"
    opener = "" if first else '"<think>" '
    lark = (
        ("start: think @answer\n" if first else "start: think? @answer\n")
        + f"think: {opener}thought /[ \\t\\r\\n]*/\n"
        + 'thought[stop="</think>"]: /(.|\\n)*/\n'
    )
    top["grammars"].insert(0, {"name": "thinking", "lark_grammar": lark})
    return json.dumps(top)
