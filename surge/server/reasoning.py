"""Reasoning models' thinking, read apart from their answer (`--reasoning-parser`, vLLM's flag).

Qwen3, QwQ and DeepSeek-R1 think inside `<think>` ... `</think>` and answer after it. The
answer goes out as `content`, the thinking as `reasoning` (vLLM's field; it was
`reasoning_content`). Each parser reads the whole text so far, so a stream sends the difference
from what it sent before, holding back the start of a tag until it is known to be one.

- qwen3: thinking only where it was opened: the text starts with `<think>`, or the prompt ends
  with it (a template that opens the thinking for the model); it ends at `</think>`. Otherwise
  (`enable_thinking: false` in chat_template_kwargs, a model that does not think) all is
  content.
- deepseek_r1: the model starts thinking whether or not it writes `<think>` (R1's template
  opens it), so everything before `</think>` is reasoning, and a text without one is all
  reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass

from surge.server.tool_parsers.base import held_back

START, END = "<think>", "</think>"


@dataclass(frozen=True, slots=True)
class ReasoningParser:
    thinks_first: bool  # the output begins inside the thinking, tag or not

    def split(self, text: str, final: bool, prompt_opens: bool = False) -> tuple[str, str]:
        """(reasoning, content) of `text`, each growing only at its end as `text` does; not
        final, a tag's possible start is held back. `prompt_opens`: the prompt ends in
        `<think>`."""
        body = text.lstrip()
        if body.startswith(START):
            opened, body = True, body[len(START) :]
        elif not final and START.startswith(body):
            return "", ""  # maybe "<think>" on its way
        else:
            opened, body = prompt_opens or self.thinks_first, text
        if not opened:
            return "", text
        end = body.find(END)
        if end >= 0:
            return body[:end].lstrip(), body[end + len(END) :].lstrip()
        held = 0 if final else held_back(body, END)  # a partial `</think>` waits
        return body[: len(body) - held].lstrip(), ""


PARSERS = {
    "qwen3": ReasoningParser(thinks_first=False),
    "deepseek_r1": ReasoningParser(thinks_first=True),
}


class ReasoningStream:
    """One streamed choice: each update gives the new reasoning and the new content."""

    def __init__(self, parser: ReasoningParser, prompt_opens: bool) -> None:
        self.parser, self.prompt_opens = parser, prompt_opens
        self.reasoning, self.content = "", ""  # sent so far

    def update(self, text: str, final: bool) -> tuple[str, str]:
        reasoning, content = self.parser.split(text, final, self.prompt_opens)
        new = reasoning[len(self.reasoning) :], content[len(self.content) :]
        self.reasoning, self.content = reasoning, content
        return new
