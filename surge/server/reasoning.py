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
    """One streamed choice: each update gives the new reasoning and the new content, as
    `ReasoningParser.split` of the whole text would, but by positions in the text: a delta
    costs its own length (a long answer's text is not copied or searched again at each
    token)."""

    def __init__(self, parser: ReasoningParser, prompt_opens: bool) -> None:
        self.parser, self.prompt_opens = parser, prompt_opens
        self._text = ""
        self._body: int | None = None  # where the thinking (or the answer) starts, once known
        self._searched = 0  # no `</think>` starts before this
        self._thought: int | None = None  # the reasoning's first non-space character
        self._thought_sent = 0  # the reasoning is sent up to here
        self._answer: int | None = None  # where the answer starts (None: still thinking)
        self._strip = False  # the answer's leading spaces go (it follows a `</think>`)
        self._content: int | None = None  # the answer's first character sent
        self._content_sent = 0

    @property
    def content(self) -> str:
        """The answer so far (as sent)."""
        if self._content is None:
            return ""
        return self._text[self._content : self._content_sent]

    def update(self, text: str, final: bool) -> tuple[str, str]:
        self._text = text
        if self._body is None:  # is the thinking opened? (the text is short until known)
            head = text.lstrip()
            if head.startswith(START):
                self._body, opened = len(text) - len(head) + len(START), True
            elif not final and START.startswith(head):
                return "", ""  # maybe "<think>" on its way
            else:
                self._body, opened = 0, self.prompt_opens or self.parser.thinks_first
            if not opened:
                self._answer = 0
        thought = ""
        if self._answer is None:
            end = text.find(END, max(self._searched, self._body))
            if end < 0:
                self._searched = max(self._searched, len(text) - len(END) + 1)
                held = 0 if final else held_back(text[-len(END) :], END)
                return self._think(len(text) - held), ""
            thought = self._think(end)
            self._answer, self._strip = end + len(END), True
        return thought, self._say(len(text))

    def _think(self, upto: int) -> str:
        """The reasoning before `upto` not sent yet (its leading spaces skipped)."""
        assert self._body is not None
        if self._thought is None:
            start = _non_space(self._text, self._body, upto)
            if start is None:
                return ""
            self._thought = self._thought_sent = start
        new = self._text[self._thought_sent : upto] if upto > self._thought_sent else ""
        self._thought_sent = max(self._thought_sent, upto)
        return new

    def _say(self, upto: int) -> str:
        """The answer before `upto` not sent yet."""
        assert self._answer is not None
        if self._content is None:
            start = _non_space(self._text, self._answer, upto) if self._strip else self._answer
            if start is None or start >= upto:
                return ""
            self._content = self._content_sent = start
        new = self._text[self._content_sent : upto]
        self._content_sent = upto
        return new


def _non_space(text: str, start: int, end: int) -> int | None:
    """The first non-whitespace index in text[start:end] (as str.lstrip sees it), or None."""
    for i in range(start, end):
        if not text[i].isspace():
            return i
    return None
