"""Stored responses of the Responses API: what `previous_response_id`, GET, DELETE and
`/input_items` read.

A bounded LRU in the API process (`--responses-store-max`): a conversation's later turns name
their previous response instead of resending it, so each entry keeps the conversation's items
up to and including its own output (shared references to the earlier entries' items, not
copies), and a chain survives its older entries being evicted. An entry belongs to the API key
that made it: another key is told it does not exist. Used from the event loop only; gone with
the process, as vLLM's store is.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class StoredResponse:
    response: dict[str, Any]  # the response object, as it was answered
    input_items: list[dict[str, Any]]  # this request's input, each item with an id
    context: list[dict[str, Any]]  # the conversation's items through this response's output
    owner: str  # the API key's hash ("" without keys)

    @property
    def id(self) -> str:
        return str(self.response["id"])


class ResponseStore:
    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, entry: StoredResponse) -> None:
        if not self.enabled:
            return
        self._entries[entry.id] = entry
        self._entries.move_to_end(entry.id)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def get(self, response_id: str, owner: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is None or entry.owner != owner:
            return None
        self._entries.move_to_end(response_id)  # a conversation in use stays
        return entry

    def delete(self, response_id: str, owner: str) -> bool:
        entry = self._entries.get(response_id)
        if entry is None or entry.owner != owner:
            return False
        del self._entries[response_id]
        return True
