"""The dashboard page and its script, served from the package (no internet, no build step):
the same files for `surge serve` (one replica) and `surge gateway` (the fleet)."""

from __future__ import annotations

from importlib import resources

from starlette.responses import Response

_TYPES = {
    "dashboard.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}


def asset(name: str) -> Response:
    """One of the dashboard's files, or 404 for any other name."""
    if name not in _TYPES:
        return Response("not found", status_code=404, media_type="text/plain")
    body = resources.files("surge.observability").joinpath("static", name).read_bytes()
    # no-cache: a browser revalidates, so an upgraded server's page is the one shown
    return Response(body, media_type=_TYPES[name], headers={"Cache-Control": "no-cache"})
