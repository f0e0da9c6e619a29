"""Carry a broken stream on, on another upstream, from where it stopped.

An upstream that dies mid-answer (kill -9, a lost host, an idle timeout) leaves its client with
half a text. A retry from the start would send that half again; instead the gateway asks another
upstream to continue it: the completion's prompt with the text so far appended, or the chat with
that text as an open assistant message (`continue_final_message`, vLLM's extension), and
`max_tokens` less the tokens already sent (counted by the new upstream's /tokenize). Its events
reach the client as more of the same stream: the first stream's id and created time, no second
opening chunk, usage counting the first part as output.

The model goes on from the same text, so a greedy answer is the one an unbroken stream gives (up
to how the text re-tokenizes at the cut) and a sampled one is a sample from the same model. Only
plain text continues: one choice, no logprobs, no tools, no structured output, no reasoning (a
continuation could not pick up a grammar's or a parser's state); anything else ends with an
error event as before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
_OPENING = {"role": "assistant", "content": ""}  # a chat stream's first delta
# Request fields whose continuation the gateway cannot carry on.
_NOT_RESUMABLE = (
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "tools",
    "functions",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "continue_final_message",
    "use_beam_search",
    "best_of",
)


@dataclass
class StreamResume:
    """What one stream has sent so far, and how to ask another upstream for the rest."""

    path: str
    body: dict[str, Any]  # the request as forwarded
    id: str | None = None
    created: int | None = None
    pieces: list[str] = field(default_factory=list)  # choice 0's text sent so far, in pieces
    resumable: bool = True  # False once anything was sent that a continuation cannot carry
    prefix_tokens: int = 0  # the tokens of `text` when the stream was resumed (usage)

    @classmethod
    def plan(cls, path: str, body: dict[str, Any] | None) -> StreamResume | None:
        """A tracker for a streamed request whose answer can be continued, else None."""
        if body is None or body.get("stream") is not True or body.get("n") not in (None, 1):
            return None
        if any(body.get(name) not in (None, False, []) for name in _NOT_RESUMABLE):
            return None
        if path == COMPLETIONS:
            ok = isinstance(body.get("prompt"), str) and not body.get("echo")
        elif path == CHAT:
            fmt = body.get("response_format")  # the client's JSON: any shape until validated
            plain = fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text")
            ok = (
                isinstance(body.get("messages"), list)
                and plain
                and body.get("add_generation_prompt", True) is True
            )
        else:
            ok = False
        return cls(path, body) if ok else None

    def observe(self, events: bytes) -> None:
        """Read whole SSE events as they go to the client."""
        for obj in _events(events):
            self.id = self.id or obj.get("id")
            self.created = self.created or obj.get("created")
            for choice in obj.get("choices") or ():
                if choice.get("index", 0) != 0:
                    self.resumable = False
                elif self.path == COMPLETIONS:
                    self.pieces.append(choice.get("text") or "")
                else:
                    delta = choice.get("delta") or {}
                    if any(delta.get(k) for k in ("tool_calls", "reasoning", "reasoning_content")):
                        self.resumable = False
                    self.pieces.append(delta.get("content") or "")

    @property
    def text(self) -> str:
        """Choice 0's text sent so far (joined when asked: once, at the break)."""
        return "".join(self.pieces)

    def continuation(self, sent_tokens: int) -> bytes | None:
        """The request for the rest, once `sent_tokens` tokens were sent; None when the token
        limit is reached already."""
        body = dict(self.body)
        limit = (
            "max_completion_tokens"
            if body.get("max_completion_tokens") is not None
            else ("max_tokens")
        )
        if body.get(limit) is not None:
            left = int(body[limit]) - sent_tokens
            if left <= 0:
                return None
            body[limit] = left
        if body.get("min_tokens"):
            body["min_tokens"] = max(0, int(body["min_tokens"]) - sent_tokens)
        text = self.text
        if self.path == COMPLETIONS:
            body["prompt"] = body["prompt"] + text
        else:
            body["messages"] = [*body["messages"], {"role": "assistant", "content": text}]
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        self.prefix_tokens = sent_tokens
        return json.dumps(body).encode()

    def rewrite(self, events: bytes) -> bytes:
        """The continuation's whole SSE events as more of the first stream."""
        out = []
        for block in events.split(b"\n\n"):
            if not block.strip():
                continue
            obj = _event(block)
            if obj is None:
                out.append(block)
                continue
            choices = obj.get("choices") or []
            opening = choices and choices[0].get("delta") == _OPENING
            if self.path == CHAT and opening and choices[0].get("finish_reason") is None:
                continue  # its opening chunk: the client had one already
            if "id" in obj:
                obj["id"] = self.id or obj["id"]
                obj["created"] = self.created or obj.get("created")
            if usage := obj.get("usage"):
                usage["prompt_tokens"] = max(0, usage.get("prompt_tokens", 0) - self.prefix_tokens)
                usage["completion_tokens"] = usage.get("completion_tokens", 0) + self.prefix_tokens
            out.append(b"data: " + json.dumps(obj).encode())
        return b"".join(part + b"\n\n" for part in out)

    def final_events(self) -> bytes:
        """The end of a stream whose limit was reached exactly when it broke."""
        if self.path == COMPLETIONS:
            choice: dict[str, Any] = {
                "index": 0,
                "text": "",
                "logprobs": None,
                "finish_reason": "length",
            }
            kind = "text_completion"
        else:
            choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
            kind = "chat.completion.chunk"
        chunk = {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.body.get("model"),
            "choices": [choice],
        }
        return b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n"


def _events(data: bytes) -> list[dict[str, Any]]:
    return [obj for block in data.split(b"\n\n") if (obj := _event(block)) is not None]


def _event(block: bytes) -> dict[str, Any] | None:
    """The JSON object of one SSE event's `data:` line (None for [DONE] and the rest)."""
    for line in block.splitlines():
        if line.startswith(b"data: ") and line[6:].strip() != b"[DONE]":
            try:
                obj = json.loads(line[6:])
            except ValueError:
                return None
            return obj if isinstance(obj, dict) else None
    return None
