"""POST /score, /v1/score (vLLM) and /rerank, /v1/rerank, /v2/rerank (Jina/Cohere shape): text
pairs scored with the embedding model, their texts embedded through the same dynamic batcher as
/v1/embeddings (each distinct text once)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from surge.server.embeddings import EmbeddingService
from surge.server.openapi import ADMITTED
from surge.server.protocol_scoring import (
    RerankRequest,
    ScoreRequest,
    cosine,
    rerank_response,
    score_response,
    unique_texts,
)
from surge.server.routes.embeddings import embed_request, embedding_service

router = APIRouter()


@router.post("/score", responses=ADMITTED)
@router.post("/v1/score", responses=ADMITTED)
async def score(body: ScoreRequest, request: Request) -> Response:
    service = embedding_service(request, body.model)
    embedded = await _embed_each_once(
        request, service, [t for pair in body.pairs() for t in pair], body.truncate_prompt_tokens
    )
    if embedded is None:
        return Response(status_code=499)
    vectors, where, num_tokens = embedded
    scores = cosine(vectors, where[0::2], where[1::2])
    return JSONResponse(score_response(scores, service.name, num_tokens))


@router.post("/rerank", responses=ADMITTED)
@router.post("/v1/rerank", responses=ADMITTED)
@router.post("/v2/rerank", responses=ADMITTED)
async def rerank(body: RerankRequest, request: Request) -> Response:
    service = embedding_service(request, body.model)
    documents = body.texts()
    embedded = await _embed_each_once(
        request, service, [body.query, *documents], body.truncate_prompt_tokens
    )
    if embedded is None:
        return Response(status_code=499)
    vectors, where, num_tokens = embedded
    scores = cosine(vectors, [where[0]] * len(documents), where[1:])
    return JSONResponse(rerank_response(body, documents, scores, service.name, num_tokens))


async def _embed_each_once(
    request: Request, service: EmbeddingService, texts: list[str], truncate: int | None
) -> tuple[list[list[float]], list[int], int] | None:
    """The vectors of `texts`' distinct texts, where each of `texts` is among them, and the
    tokens embedded; None when the client went away first."""
    unique, where = unique_texts(texts)
    token_ids = service.prepare(unique, truncate)
    vectors = await embed_request(request, service, token_ids)
    if vectors is None:
        return None
    return vectors, where, sum(len(ids) for ids in token_ids)
