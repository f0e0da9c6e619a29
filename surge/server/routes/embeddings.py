"""POST /v1/embeddings: one vector per input; inputs of concurrent requests share batches."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from surge.http.disconnect import done_before_disconnect
from surge.server.embeddings import EmbeddingService
from surge.server.errors import (
    BadRequestError,
    NotFoundError,
    RateLimitError,
    RequestTimeoutError,
    SurgeHTTPError,
)
from surge.server.openapi import ADMITTED
from surge.server.protocol_embeddings import MAX_INPUTS, EmbeddingRequest, embedding_response
from surge.server.request_span import record_embedding_span
from surge.server.state import client_key, get_state, request_timeout_s

router = APIRouter()


@router.post("/v1/embeddings", responses=ADMITTED)
async def create_embedding(body: EmbeddingRequest, request: Request) -> Response:
    service = embedding_service(request, body.model)
    if body.dimensions is not None and body.dimensions != service.model.dim:
        raise BadRequestError(
            f"dimensions: this model's vectors have {service.model.dim} dimensions and it was "
            "not trained to be shortened",
            param="dimensions",
        )
    inputs = body.inputs()
    if len(inputs) > MAX_INPUTS:
        raise BadRequestError(
            f"input has {len(inputs)} items; at most {MAX_INPUTS} per request", param="input"
        )
    token_ids = service.prepare(inputs, body.truncate_prompt_tokens)
    num_tokens = sum(len(ids) for ids in token_ids)
    vectors = await embed_request(request, service, token_ids)
    if vectors is None:
        return Response(status_code=499)
    return JSONResponse(embedding_response(vectors, service.name, body.encoding_format, num_tokens))


def embedding_service(request: Request, model: str | None) -> EmbeddingService:
    """The served embedding model, or a 404 (none served, or another name asked for)."""
    service = get_state(request).embeddings
    if service is None:
        raise NotFoundError(
            "this server serves no embedding model; start it with "
            "--embedding-model all-minilm-l6-v2 (or a sentence-transformers folder)",
            code="model_not_found",
        )
    if model is not None and model != service.name:
        raise NotFoundError.model_not_found(model)
    return service


async def embed_request(
    request: Request, service: EmbeddingService, token_ids: list[list[int]]
) -> list[list[float]] | None:
    """The vectors of one request's inputs through the shared batcher, under its rate limits,
    timeout and span; None when the client went away first."""
    state = get_state(request)
    num_tokens = sum(len(ids) for ids in token_ids)
    arrival_s = getattr(request.state, "arrival_s", time.monotonic())
    error: str | None = None
    try:
        return await _embed(request, service, token_ids, num_tokens)
    except SurgeHTTPError as e:
        error = str(e.code or e.type)
        raise
    finally:
        record_embedding_span(
            state, request.headers, arrival_s, service.name, len(token_ids), num_tokens, error
        )


async def _embed(
    request: Request,
    service: EmbeddingService,
    token_ids: list[list[int]],
    num_tokens: int,
) -> list[list[float]] | None:
    state = get_state(request)
    timeout_s = request_timeout_s(request, state.config)
    state.check_embedding_request(client_key(request), num_tokens)
    work = asyncio.create_task(service.embed(token_ids))
    try:
        async with asyncio.timeout(timeout_s):
            finished = await done_before_disconnect(work, request)
    except TimeoutError:
        state.metrics.observe_abort("timeout")
        raise RequestTimeoutError(f"request timed out after {timeout_s:g}s") from None
    if not finished or work.cancelled():
        work.cancel()  # its inputs still waiting leave the batcher's queue
        state.metrics.observe_abort("client_disconnect")
        return None
    exc = work.exception()
    if isinstance(exc, RateLimitError):
        state.metrics.observe_rejection(str(exc.code))
    if exc is not None:
        raise exc
    return work.result()
