"""Models, health, metrics, version, and vLLM's /tokenize and /detokenize."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from surge.kv_events.hashing import HASH_SCHEME
from surge.server.errors import BadRequestError, NotFoundError
from surge.server.openapi import HEALTH, LISTING, LOOKUP, METRICS, with_200
from surge.server.protocol_responses import (
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeResponse,
)
from surge.server.protocol_tokenize import DetokenizeRequest, TokenizeRequest
from surge.server.state import ServerState, get_state

router = APIRouter()

VERSION = "0.1.0"


@router.get("/v1/models", responses=with_200(ModelList) | LISTING)
async def list_models(request: Request) -> JSONResponse:
    cards = _model_cards(get_state(request))
    return JSONResponse(ModelList(data=cards).model_dump(mode="json"))


@router.get("/v1/models/{model:path}", responses=with_200(ModelCard) | LOOKUP)
async def retrieve_model(model: str, request: Request) -> JSONResponse:
    """One model's card (`client.models.retrieve`): the base model, an adapter or the
    embedding model; 404 otherwise."""
    card = next((c for c in _model_cards(get_state(request)) if c.id == model), None)
    if card is None:
        raise NotFoundError.model_not_found(model)
    return JSONResponse(card.model_dump(mode="json"))


def _model_cards(state: ServerState) -> list[ModelCard]:
    base = state.config.served_model_name
    cards = [ModelCard(id=base, root=state.model_path, max_model_len=state.max_model_len)]
    cards += [
        ModelCard(id=name, root=path, parent=base, max_model_len=state.max_model_len)
        for name, path in state.client.lora_adapters.items()
    ]
    if (service := state.embeddings) is not None:
        cards.append(ModelCard(id=service.name, max_model_len=service.model.max_len))
    return cards


@router.get("/health", responses=HEALTH)
async def health(request: Request) -> Response:
    """200 when the engine is alive and the server admits work; 503 otherwise."""
    state = get_state(request)
    if not state.client.healthy:
        return _unhealthy(state)
    if state.admission.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    return JSONResponse({"status": "ok"})


# Kubernetes probes. The HTTP port opens only once the engine has loaded the model (launch.py),
# so a connection refused is "still starting" and any answer means the model is loaded.
@router.get("/health/live", responses=HEALTH)
async def health_live(request: Request) -> Response:
    """Liveness: 503 only when the engine is dead (restart me); 200 while draining."""
    state = get_state(request)
    if not state.client.healthy:
        return _unhealthy(state)
    return JSONResponse({"status": "ok", "draining": state.admission.draining})


@router.get("/health/ready", responses=HEALTH)
async def health_ready(request: Request) -> Response:
    """Readiness: 200 only when this replica should get traffic (loaded, engine alive, not
    draining, admitting); 503 with the reason otherwise."""
    state = get_state(request)
    if not state.client.healthy:
        return _unhealthy(state)
    if state.admission.draining:
        return JSONResponse({"status": "draining", "reason": "draining"}, status_code=503)
    if not state.admission.ready:
        return JSONResponse({"status": "not_ready", "reason": "not ready"}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/health/startup", responses=HEALTH)
async def health_startup(request: Request) -> Response:
    """Startup: 200 once the model is loaded (the port is open), draining or not."""
    state = get_state(request)
    if not state.client.healthy:
        return _unhealthy(state)
    return JSONResponse({"status": "started", "model": state.config.served_model_name})


def _unhealthy(state: ServerState) -> JSONResponse:
    reason = state.client.dead_reason or "engine process is not running"
    return JSONResponse({"status": "unhealthy", "reason": reason}, status_code=503)


@router.get("/metrics", response_class=Response, responses=METRICS)
async def metrics(request: Request) -> Response:
    state = get_state(request)
    state.metrics.set_health(state.client.healthy)
    state.metrics.update_engine(state.client.take_stats())
    state.metrics.set_responses(len(state.responses), len(state.background))
    if state.embeddings is not None:
        state.embeddings.metrics.set_queue_depth(state.embeddings.batcher.queue_depth)
    body, content_type = state.metrics.render()
    return Response(content=body, media_type=content_type)


@router.get("/version")
async def version(request: Request) -> JSONResponse:
    """The version; with --kv-events-endpoint, where the KV events are published too (what a
    KV-aware router subscribes to: surge/gateway/kv_subscriber.py)."""
    body: dict[str, object] = {"version": VERSION}
    info = get_state(request).client.info
    if info.kv_events_endpoint is not None:
        body["kv_events"] = {
            "endpoint": info.kv_events_endpoint,
            "replay_endpoint": info.kv_events_replay_endpoint,
            "topic": info.kv_events_topic,
            "block_size": info.block_size,
            "hash": HASH_SCHEME,
        }
    return JSONResponse(body)


@router.post("/tokenize", responses=with_200(TokenizeResponse) | LOOKUP)
async def tokenize(body: TokenizeRequest, request: Request) -> JSONResponse:
    state = get_state(request)
    state.check_model(body.model)
    tok = state.tokenizer
    if body.messages is not None:
        from surge.server.routes.chat import render_text

        text = render_text(state, body)
    else:
        text = body.prompt or ""
    ids = tok.encode(text, add_special_tokens=body.wants_special_tokens())
    resp = TokenizeResponse(count=len(ids), max_model_len=state.max_model_len, tokens=ids)
    return JSONResponse(resp.model_dump(mode="json"))


@router.post("/detokenize", responses=with_200(DetokenizeResponse) | LOOKUP)
async def detokenize(body: DetokenizeRequest, request: Request) -> JSONResponse:
    state = get_state(request)
    state.check_model(body.model)
    if any(t >= state.client.info.vocab_size for t in body.tokens):
        raise BadRequestError("token id out of the vocabulary", param="tokens")
    text = state.tokenizer.decode(body.tokens, skip_special_tokens=False)
    return JSONResponse(DetokenizeResponse(prompt=text).model_dump(mode="json"))
