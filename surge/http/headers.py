"""HTTP headers the server sets for the gateway in front of it to read."""

from __future__ import annotations

# A stored Responses API response's id, on the answer that made it: the gateway learns which
# upstream holds it, for the later turns that name it and for GET / DELETE.
RESPONSE_ID_HEADER = "x-surge-response-id"
