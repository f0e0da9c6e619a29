"""Which upstream most likely holds a prompt's prefix in its KV cache.

The gateway cannot see the upstreams' caches, so it remembers where it sent each prefix: the
rendered prompt is cut into fixed-size chunks of characters, each chunk hashed together with
the hash before it (so a hash stands for the whole prefix up to its chunk, like the engine's
block hashes), and a bounded LRU maps hash -> upstream. The longest remembered prefix wins.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Container, Mapping, Sequence
from typing import Any

from surge.gateway.config import PrefixConfig
from surge.gateway.kv_config import KvConfig
from surge.gateway.kv_tokens import prompt_tokens
from surge.gateway.upstreams import RouteKey


def render_for_routing(body: Mapping[str, Any]) -> str:
    """The prompt as text, close enough to what the upstream renders that equal prefixes give
    equal text: every message in full (hashing only the system prompt, as sglang#26263 did,
    sends every conversation with one system prompt to one upstream)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = []
        for m in messages:
            if isinstance(m, Mapping):
                parts.append(f"<{m.get('role', '')}>\n{_content_text(m.get('content'))}\n")
        return "".join(parts)
    if "input" in body:  # the Responses API: instructions, then the input (text or items)
        items = body["input"]
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        head = body.get("instructions")
        parts = [f"<system>\n{head}\n"] if isinstance(head, str) else []
        for m in items if isinstance(items, list) else []:
            if isinstance(m, Mapping):
                text = _content_text(m.get("content", m.get("output", m.get("arguments"))))
                parts.append(f"<{m.get('role', m.get('type', ''))}>\n{text}\n")
        return "".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, str):
            return first  # a batch of prompts goes where its first one is cached
        if isinstance(first, int):
            return " ".join(map(str, prompt))  # token ids
        if isinstance(first, list):
            return " ".join(map(str, first))
    return ""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                texts.append(json.dumps(part, sort_keys=True, default=str))
        return "".join(texts)
    return "" if content is None else str(content)


def chunk_hashes(text: str, chunk_chars: int, max_chunks: int, salt: str = "") -> tuple[int, ...]:
    """Chained 64-bit hashes of the text's full chunks; a shorter tail has no hash.

    `salt` (the model and the request's cache_salt) starts the chain: a prefix cached for one
    model or tenant is no hit for another.
    """
    digest = hashlib.blake2b(salt.encode(), digest_size=8).digest()
    out = []
    for i in range(min(len(text) // chunk_chars, max_chunks)):
        chunk = text[i * chunk_chars : (i + 1) * chunk_chars].encode("utf-8", "surrogatepass")
        digest = hashlib.blake2b(digest + chunk, digest_size=8).digest()
        out.append(int.from_bytes(digest, "little"))
    return tuple(out)


def route_key(
    body: Mapping[str, Any] | None,
    session: str | None,
    prefix: PrefixConfig | None,
    kv: KvConfig | None = None,
) -> RouteKey:
    """The request's RouteKey. `session` is the session header's value; without one the body's
    `user` keys the session. Prefix hashes only when `prefix` is given, the prompt's tokens
    only when `kv` is (both cost CPU)."""
    if body is None:
        return RouteKey(session=session)
    if session is None and isinstance(body.get("user"), str) and body["user"]:
        session = body["user"]
    hashes: tuple[int, ...] = ()
    if prefix is not None:
        salt = f"{body.get('model', '')}\x00{body.get('cache_salt', '')}"
        text = render_for_routing(body)
        hashes = chunk_hashes(text, prefix.chunk_chars, prefix.max_chunks, salt)
    if kv is not None and (tokens := prompt_tokens(body, kv.tokenizer, kv.max_tokens)):
        return RouteKey(session, hashes, tokens.token_ids, tokens.cache_salt)
    return RouteKey(session=session, prefix_hashes=hashes)


class PrefixAffinity:
    """Bounded LRU: chunk hash -> the upstream its prefix was last sent to."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._lru: OrderedDict[int, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def match(self, hashes: Sequence[int], urls: Container[str]) -> tuple[str | None, int]:
        """(upstream, matched chunks) of the longest remembered prefix whose upstream is in
        `urls`; (None, 0) when there is none. Changes nothing."""
        for i in range(len(hashes) - 1, -1, -1):
            url = self._lru.get(hashes[i])
            if url is not None and url in urls:
                return url, i + 1
        return None, 0

    def record(self, hashes: Sequence[int], url: str) -> None:
        """The prefix was sent to `url`: it now holds (or will hold) every chunk of it."""
        lru = self._lru
        for h in hashes:
            lru[h] = url
            lru.move_to_end(h)
        while len(lru) > self.max_entries:
            lru.popitem(last=False)
