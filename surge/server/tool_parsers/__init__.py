"""Tool-call parsers for tool_choice "auto" (`--enable-auto-tool-choice --tool-call-parser`),
named as vLLM names them."""

from __future__ import annotations

from surge.server.tool_parsers.base import PartialCall, Reading, ToolParser
from surge.server.tool_parsers.hermes import HermesParser
from surge.server.tool_parsers.llama3_json import Llama3JsonParser
from surge.server.tool_parsers.mistral import MistralParser
from surge.server.tool_parsers.pythonic import PythonicParser
from surge.server.tool_parsers.stream import ToolCallStream

PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (HermesParser, Llama3JsonParser, MistralParser, PythonicParser)
}


def parser_for_template(template: str | None) -> type[ToolParser]:
    """The syntax a chat template teaches its model (Hermes' when it teaches none: the prompt
    then carries it, see prompt.py)."""
    text = template or ""
    if "[func_name1(" in text:
        return PythonicParser
    if "<tool_call>" in text:
        return HermesParser
    if "<|python_tag|>" in text or '"parameters": dictionary' in text:
        return Llama3JsonParser
    if "[TOOL_CALLS]" in text or "[AVAILABLE_TOOLS]" in text:
        return MistralParser
    return HermesParser


__all__ = [
    "PARSERS",
    "PartialCall",
    "Reading",
    "ToolCallStream",
    "ToolParser",
    "parser_for_template",
]
