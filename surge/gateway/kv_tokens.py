"""A request's prompt tokens as a replica computes them, for the KV-aware policy's lookups.

The one gateway module that reads model files (surge/models/formats: tokenizer and chat
template, no torch; an exception in tests/test_structure.py): a replica's block hashes are
hashes of token ids, so the gateway must tokenize exactly as the replica does to find them.
It renders what the server renders for plain requests (chat messages with string or text-part
content, completions' prompt text or ids); anything else (tools the template writes, the
Responses API, LoRA adapters' own salts) just finds no blocks and is balanced by load.
"""

from __future__ import annotations

import functools
import logging
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from surge.models.formats.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PromptTokens:
    token_ids: tuple[int, ...]
    cache_salt: str = ""  # the request's cache_salt: the first block's extra, as the engine's


@functools.lru_cache(maxsize=4)
def load_tokenizer(model: str) -> Tokenizer:
    """The model's tokenizer, read once (the vocabulary takes a moment: load it at start)."""
    # Imported here: the gateway under any other policy never pays for the model readers.
    from surge.models.formats.model_files import open_model
    from surge.models.formats.resolve import resolve_model

    return open_model(resolve_model(model)).tokenizer


class SegmentEncoder:
    """The tokenizer's encode, with the ids of long pieces of text kept (an LRU).

    A byte-level BPE's pre-tokenizer costs ~0.5 us a character (1.2 ms for a 2 KB system
    prompt), more than the rest of a pick; but requests repeat long pieces (shared system
    prompts, a conversation's earlier turns). The `tokenizers` library cuts a text at its added
    tokens (<|im_start|>, ...) first and encodes each piece on its own, so cutting there too
    and encoding each piece (or taking its kept ids) gives the same ids as encoding the whole,
    where the cut is the library's: added tokens that strip no space around them, match whole
    strings and are matched before normalizing, and no pre-tokenizer that treats the first
    piece apart (Metaspace's prepend_scheme "first"). Otherwise every text is encoded whole.
    """

    def __init__(self, tok: Tokenizer, max_entries: int = 4096, min_chars: int = 128) -> None:
        self.tok, self.max_entries, self.min_chars = tok, max_entries, min_chars
        backend = tok.backend
        added = backend.get_added_tokens_decoder()
        self._ids = {t.content: i for i, t in added.items()}
        plain = all(
            not (t.lstrip or t.rstrip or t.single_word)
            and (not t.normalized or backend.normalizer is None)
            for t in added.values()
        )
        per_piece = "first" not in repr(backend.pre_tokenizer).lower()
        self._cut: re.Pattern[str] | None = None
        if added and plain and per_piece:  # longest first: the library's leftmost-longest
            names = sorted(self._ids, key=len, reverse=True)
            self._cut = re.compile("(" + "|".join(map(re.escape, names)) + ")")
        self._kept: OrderedDict[str, list[int]] = OrderedDict()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """As Tokenizer.encode."""
        if self._cut is None:
            return self.tok.encode(text, add_special_tokens)
        ids: list[int] = []
        if add_special_tokens and self.tok.add_bos_token and self.tok.bos_token_id is not None:
            ids.append(self.tok.bos_token_id)
        for i, piece in enumerate(self._cut.split(text)):
            if i % 2:  # the split's odd items are the added tokens matched
                ids.append(self._ids[piece])
            elif piece:
                ids += self._piece(piece)
        return ids

    def _piece(self, piece: str) -> list[int]:
        if len(piece) < self.min_chars:
            return self.tok.encode(piece, add_special_tokens=False)
        kept = self._kept.get(piece)
        if kept is not None:
            self._kept.move_to_end(piece)
            return kept
        kept = self._kept[piece] = self.tok.encode(piece, add_special_tokens=False)
        if len(self._kept) > self.max_entries:
            self._kept.popitem(last=False)
        return kept


@functools.lru_cache(maxsize=4)
def load_encoder(model: str) -> SegmentEncoder:
    return SegmentEncoder(load_tokenizer(model))


def _content(content: Any) -> str:
    """As the server flattens message content (protocol_messages.flatten_message_content)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) if isinstance(p, Mapping) else "" for p in content)
    raise ValueError("unsupported content")


def _chat_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        if not isinstance(m, Mapping):
            raise ValueError("a message is an object")
        item: dict[str, Any] = {"role": m.get("role"), "content": _content(m.get("content"))}
        for key in ("name", "tool_calls", "tool_call_id"):
            if m.get(key) is not None:
                item[key] = m[key]
        if (thought := m.get("reasoning_content") or m.get("reasoning")) is not None:
            item["reasoning_content"] = item["reasoning"] = thought
        out.append(item)
    return out


def prompt_tokens(body: Mapping[str, Any], model: str, max_tokens: int) -> PromptTokens | None:
    """The prompt's first `max_tokens` token ids and cache_salt; None when the request is not
    one this renders (or cannot be rendered: the replica will say why)."""
    salt = body.get("cache_salt")
    salt = salt if isinstance(salt, str) else ""
    try:
        ids = _token_ids(body, model)
    except Exception as e:  # a bad request is the replica's to refuse; route it by load
        log.debug("kv routing: request not tokenized: %s", e)
        return None
    if not ids:
        return None
    return PromptTokens(tuple(ids[:max_tokens]), salt)


def _token_ids(body: Mapping[str, Any], model: str) -> list[int] | None:
    messages = body.get("messages")
    if isinstance(messages, list):
        if body.get("tools") or body.get("continue_final_message"):
            return None  # rendered with the server's tool prompt / cut: not reproduced here
        tok = load_tokenizer(model)
        kwargs = dict(body.get("chat_template_kwargs") or {})
        if isinstance(effort := body.get("reasoning_effort"), str):
            kwargs.setdefault("reasoning_effort", effort)
        text = tok.apply_chat_template(
            _chat_messages(messages),
            add_generation_prompt=body.get("add_generation_prompt", True) is not False,
            **kwargs,
        )
        return load_encoder(model).encode(text, add_special_tokens=False)  # the template's BOS
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of prompts goes where its first one is cached
    if isinstance(prompt, str):
        return load_encoder(model).encode(prompt) if prompt else None
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    return None
