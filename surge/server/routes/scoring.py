"""POST /score, /v1/score (vLLM) and /rerank, /v1/rerank, /v2/rerank (Jina/Cohere shape): text
pairs scored with the embedding model, their texts embedded through the same dynamic batcher as
/v1/embeddings (each distinct text once)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

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


@router.post("/score")
@router.post("/v1/score")
async def score(body: ScoreRequest, request: Request) -> Response:
    service = embedding_service(request, body.model)
    pairs = body.pairs()
    texts, where = unique_texts([t for pair in pairs for t in pair])
    token_ids = service.prepare(texts, body.truncate_prompt_tokens)
    vectors = await embed_request(request, service, token_ids)
    if vectors is None:
        return Response(status_code=499)
    scores = cosine(vectors, where[0::2], where[1::2])
    num_tokens = sum(len(ids) for ids in token_ids)
    return JSONResponse(score_response(scores, service.name, num_tokens))


@router.post("/rerank")
@router.post("/v1/rerank")
@router.post("/v2/rerank")
async def rerank(body: RerankRequest, request: Request) -> Response:
    service = embedding_service(request, body.model)
    documents = body.texts()
    texts, where = unique_texts([body.query, *documents])
    token_ids = service.prepare(texts, body.truncate_prompt_tokens)
    vectors = await embed_request(request, service, token_ids)
    if vectors is None:
        return Response(status_code=499)
    scores = cosine(vectors, [where[0]] * len(documents), where[1:])
    num_tokens = sum(len(ids) for ids in token_ids)
    return JSONResponse(rerank_response(body, documents, scores, service.name, num_tokens))
