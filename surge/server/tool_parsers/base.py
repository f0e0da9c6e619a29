"""What a tool-call parser reads from a model's output, for tool_choice "auto".

Without a constraint the model is free to answer in text or to call tools in its own syntax
(Hermes' `<tool_call>` blocks, Llama 3's bare JSON, Llama 3.2's Python list...). A parser reads
the text generated so far and says what it holds: the plain content, and each call begun, with
its name once known and its arguments' JSON text so far. For a growing text what it reports only
grows (content and arguments are prefixes of what they become; a name, once given, stays), so a
stream sends differences and never takes anything back. The finished reading may still find a
call malformed; then the whole text is the answer, as content."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from surge.server.tools import ToolCall, new_call_id


@dataclass(frozen=True, slots=True)
class PartialCall:
    name: str | None  # None until the name is written whole
    arguments: str  # JSON text so far
    done: bool = False  # the call's text has ended
    valid: bool = True  # ended, it parsed as a call


@dataclass(frozen=True, slots=True)
class Reading:
    content: str  # text to show as the answer (what may still turn into a call is held back)
    calls: list[PartialCall] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return all(c.valid and c.name is not None for c in self.calls)

    @property
    def complete(self) -> bool:
        """Every call ended and read: the calls of a finished output."""
        return self.valid and all(c.done for c in self.calls)


class ToolParser(ABC):
    """One model family's tool-call syntax: how to read it, and how to ask for it in a prompt
    when the chat template does not render tools itself."""

    name: ClassVar[str]

    def __init__(self, tool_names: Sequence[str]) -> None:
        self.tool_names = frozenset(tool_names)

    @abstractmethod
    def read(self, text: str, final: bool) -> Reading:
        """What `text` holds; `final`: the output has ended (nothing is held back)."""

    def answer(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, calls) of a finished output: the text itself when it holds no call, or a
        malformed one (cut by max_tokens, or not JSON)."""
        reading = self.read(text, final=True)
        if not reading.calls or not reading.complete:
            return text, []
        calls = [ToolCall(c.name or "", c.arguments, new_call_id()) for c in reading.calls]
        return reading.content if reading.content.strip() else None, calls

    # -- prompting, for chat templates that render no tools ------------------------------------

    @abstractmethod
    def tools_prompt(self, tools: Sequence[Mapping[str, Any]]) -> str:
        """System-prompt text that lists the tools and shows how to call them."""

    @abstractmethod
    def format_call(self, name: str, arguments: str) -> str:
        """An earlier turn's call, written as this model writes one."""

    def format_result(self, content: str) -> str:
        """A tool's answer, as the next user turn shows it."""
        return f"<tool_response>\n{content}\n</tool_response>"


def held_back(text: str, marker: str) -> int:
    """How many characters at the end of `text` could be the start of `marker` (those wait:
    the next token may complete it)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def after_tag(text: str, final: bool, tag: str) -> str | None:
    """The answer past a leading `tag` (which a decode that drops control tokens may have
    dropped), or None while what came so far is empty or could still become the tag."""
    body = text.lstrip()
    if body.startswith(tag):
        return body[len(tag) :].lstrip() or (None if not final else "")
    if not final and tag.startswith(body):
        return None
    return body


def tools_json_lines(tools: Sequence[Mapping[str, Any]]) -> str:
    return "\n".join(json.dumps(dict(t), ensure_ascii=False) for t in tools)
