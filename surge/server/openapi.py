"""What /openapi.json declares beyond FastAPI's defaults, so that generated clients and schema
fuzzers agree with the server: every status a route really answers, each error in the OpenAI
shape (surge/http/openai_errors.py `ErrorResponse`), SSE where a route streams, Prometheus text for
/metrics. FastAPI's own 422 is taken out: validation failures are 400s here (errors.py)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from surge.http.openai_errors import error_responses

Responses = dict[int | str, dict[str, Any]]

# Any route: a body over --max-body-bytes (413, by the middleware), a crash (500).
EVERY_ROUTE = error_responses(413, 500)
# Behind the API key (with --api-key: all but the probes, /metrics and /version): 401. A body or
# parameter that fails validation (or a body with a lone surrogate): 400.
LISTING = error_responses(401)
LOOKUP = error_responses(400, 401, 404)  # plus nothing of that name (model, response, adapter)
# The routes that admit work (generation; embeddings, scores, reranks): plus rate limits and
# full queues (429), draining, overload or a dead engine (503), the request timeout (504).
ADMITTED = error_responses(400, 401, 404, 429, 503, 504)


# One server-sent event (OpenAPI 3.2's `itemSchema`, as FastAPI writes it for its own SSE
# routes): `data` is a JSON chunk, or `[DONE]` last; the Responses API names its events.
SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "data": {"type": "string", "description": "a JSON chunk, or [DONE] last"},
        "event": {"type": "string"},
        "id": {"type": "string"},
        "retry": {"type": "integer", "minimum": 0},
    },
}


def with_200(model: type[BaseModel] | None = None, *, stream: bool = False) -> Responses:
    """The 200 of a JSON route (its body's model, if it has one), and with `stream` its SSE
    form (`stream: true`): `data: <chunk>` events, then `data: [DONE]`."""
    ok: dict[str, Any] = {"description": "Success"}
    if model is not None:
        ok["model"] = model
    if stream:
        ok["content"] = {"text/event-stream": {"itemSchema": SSE_EVENT}}
        ok["description"] = "JSON, or server-sent events with `stream: true`"
    return {200: ok}


class HealthStatus(BaseModel):
    """A probe's answer: 200 `ok` (or `started`), 503 with the reason otherwise."""

    status: str
    reason: str | None = None
    draining: bool | None = None
    model: str | None = None


HEALTH: Responses = {
    200: {"model": HealthStatus, "description": "Healthy"},
    503: {"model": HealthStatus, "description": "Unhealthy, draining or not ready, and why"},
}

# With `response_class=Response` (no media type of its own): FastAPI then declares no JSON.
METRICS: Responses = {
    200: {
        "description": "Prometheus text exposition format",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
}


def install_openapi(app: FastAPI) -> None:
    """Serve the document built once, with FastAPI's 422 and its validation schemas removed."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            schemas = schema.get("components", {}).get("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
