"""A chat stream's tool calls: the differences between successive readings of a choice's text,
as OpenAI streams them (content first; then each call opens with its id and name, and its
arguments follow in pieces under the call's index)."""

from __future__ import annotations

from typing import Any

from surge.server.tool_parsers.base import Reading, ToolParser
from surge.server.tools import new_call_id


class ToolCallStream:
    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self._content_sent = 0
        self._calls: list[tuple[str, int]] = []  # (id, length of the arguments sent)

    @property
    def called(self) -> bool:
        """Whether any call has been sent (the choice then finishes with "tool_calls")."""
        return bool(self._calls)

    def update(self, text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        """(content, tool-call deltas) to send now that the text is `text`."""
        reading = self.parser.read(text, final)
        if final and not self._calls and not reading.complete:
            reading = Reading(text)  # malformed, and none of it sent as a call: it is the answer
        content = ""
        if not self._calls and len(reading.content) > self._content_sent:
            content = reading.content[self._content_sent :]
            self._content_sent = len(reading.content)
        deltas: list[dict[str, Any]] = []
        for k, call in enumerate(reading.calls):
            if call.name is None or not call.valid:
                break  # calls go out in order: none after one not yet (or never) readable
            if k == len(self._calls):
                call_id = new_call_id()
                self._calls.append((call_id, len(call.arguments)))
                function = {"name": call.name, "arguments": call.arguments}
                deltas.append({"index": k, "id": call_id, "type": "function", "function": function})
                continue
            call_id, sent = self._calls[k]
            if len(call.arguments) > sent:
                deltas.append({"index": k, "function": {"arguments": call.arguments[sent:]}})
                self._calls[k] = (call_id, len(call.arguments))
        return content, deltas
