"""Which upstream holds a stored Responses API response.

Each server stores the responses it made, so a later turn's `previous_response_id`, and GET or
DELETE of a response, must reach that server. The gateway learns the owner from the header on
the answer that made it; for an id it has not seen (made before this gateway started, or through
another gateway) it asks the upstreams in rotation, all at once, and keeps the one that has it.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from urllib.parse import quote

import httpx

from surge.gateway.upstreams import Upstream


class ResponseOwners:
    def __init__(self, max_entries: int = 100_000) -> None:
        self.max_entries = max_entries
        self._owners: OrderedDict[str, str] = OrderedDict()  # response id -> upstream url

    def learn(self, response_id: str, url: str) -> None:
        self._owners[response_id] = url
        self._owners.move_to_end(response_id)
        while len(self._owners) > self.max_entries:
            self._owners.popitem(last=False)

    def forget(self, response_id: str) -> None:
        self._owners.pop(response_id, None)

    async def locate(
        self,
        response_id: str,
        upstreams: Sequence[Upstream],
        client: httpx.AsyncClient,
        headers: Mapping[str, str],
        timeout_s: float,
    ) -> str | None:
        """The url of the upstream in `upstreams` (those in rotation) that holds the response,
        or None where none does; `headers` carry the client's API key, which owns it."""
        urls = [u.url for u in upstreams]
        known = self._owners.get(response_id)
        if known in urls:
            return known
        path = f"/v1/responses/{quote(response_id, safe='')}"
        pending = {
            asyncio.ensure_future(_holds(client, url + path, headers, timeout_s)): url
            for url in urls
        }
        try:
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for ask in done:
                    url = pending.pop(ask)
                    if ask.result():
                        self.learn(response_id, url)
                        return url
        finally:
            for ask in pending:
                ask.cancel()
        return None


async def _holds(
    client: httpx.AsyncClient, url: str, headers: Mapping[str, str], timeout_s: float
) -> bool:
    try:
        return (await client.get(url, headers=headers, timeout=timeout_s)).status_code == 200
    except httpx.HTTPError:
        return False
