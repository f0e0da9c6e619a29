"""build_app(state) -> FastAPI: routes, OpenAI-shaped errors, body limit and API-key middleware."""

from __future__ import annotations

from fastapi import FastAPI

from surge.batch import routes as batch_routes
from surge.batch.routes import MULTIPART_OVERHEAD
from surge.http.request_id import RequestIdMiddleware
from surge.server.errors import install_error_handlers
from surge.server.middleware import (
    ApiKeyMiddleware,
    ArrivalTimeMiddleware,
    BodySizeLimitMiddleware,
)
from surge.server.openapi import EVERY_ROUTE, install_openapi
from surge.server.routes import (
    chat,
    completions,
    dashboard,
    embeddings,
    lora,
    misc,
    responses,
    scoring,
    stored_responses,
)
from surge.server.state import ServerState


def build_app(state: ServerState) -> FastAPI:
    app = FastAPI(
        title="Surge", version=misc.VERSION, docs_url=None, redoc_url=None, responses=EVERY_ROUTE
    )
    install_openapi(app)
    app.state.surge = state
    install_error_handlers(app)
    app.include_router(completions.router)
    app.include_router(chat.router)
    app.include_router(embeddings.router)
    app.include_router(scoring.router)
    app.include_router(misc.router)
    app.include_router(lora.router)
    app.include_router(responses.router)
    app.include_router(stored_responses.router)
    app.include_router(dashboard.router)
    app.include_router(batch_routes.router)  # the service: app.state.batch (batch_api.py)
    app.state.batch = None
    # The last added is outermost: the size check runs inside the key check.
    uploads = {"/v1/files": state.config.batch.max_file_bytes + MULTIPART_OVERHEAD}
    app.add_middleware(
        BodySizeLimitMiddleware, max_bytes=state.config.limits.max_body_bytes, path_limits=uploads
    )
    if state.config.auth.api_keys:
        app.add_middleware(ApiKeyMiddleware, api_keys=set(state.config.auth.api_keys))
    app.add_middleware(ArrivalTimeMiddleware)  # stamps the arrival time first
    app.add_middleware(RequestIdMiddleware)  # outermost: every answer carries the id
    return app
