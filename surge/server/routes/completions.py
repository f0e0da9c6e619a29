"""POST /v1/completions: text or token prompts (one or many), stream or not."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from surge.engine.client.output_processor import SequenceDelta
from surge.server.errors import BadRequestError
from surge.server.openapi import ADMITTED, with_200
from surge.server.protocol import CompletionRequest
from surge.server.protocol_responses import (
    CompletionChoice,
    CompletionResponse,
    CompletionStreamResponse,
    new_completion_id,
)
from surge.server.routes.logprobs import (
    completion_logprobs,
    prompt_logprobs_field,
    prompt_triples,
)
from surge.server.serving import (
    Job,
    StreamedTokenIds,
    delta_triples,
    run_to_completion,
    start_job,
    stream_response,
)
from surge.server.state import get_state

router = APIRouter()


@router.post(
    "/v1/completions",
    response_model=None,
    responses=with_200(CompletionResponse, stream=True) | ADMITTED,
)
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    state = get_state(request)
    lora_name = state.check_model(body.model)
    tok = state.tokenizer
    prompts: list[list[int]] = []
    for p in body.prompt_list():
        ids = tok.encode(p) if isinstance(p, str) else list(p)
        if not ids:
            raise BadRequestError("prompt must not be empty", param="prompt")
        if any(t >= state.client.info.vocab_size for t in ids):
            raise BadRequestError("prompt token id out of the vocabulary", param="prompt")
        prompts.append(ids)
    room = body.context_room([len(p) for p in prompts], state.max_model_len, param="prompt")
    params = body.to_sampling_params(
        room=room, default_max_tokens=state.default_max_tokens, defaults=state.sampling_defaults
    )
    job = start_job(
        state,
        request,
        prompts,
        params,
        request_id=body.request_id,
        user=body.user,
        priority=body.priority if "priority" in body.model_fields_set else None,
        cache_salt=body.cache_salt,
        lora_name=lora_name,
    )
    model = body.model or state.config.served_model_name
    echo = [tok.decode(p) if body.echo else "" for p in prompts]
    if body.stream:
        return _stream(job, body, model, echo, prompts)
    if not await run_to_completion(job, request):
        return Response(status_code=499)
    choices = []
    as_ids, want_ids = body.return_tokens_as_token_ids, body.return_token_ids
    for i, c in enumerate(job.choices):
        prefix, prompt = echo[i // params.n], prompts[i // params.n]
        logprobs = None
        if params.logprobs is not None and body.echo and c.prompt_logprobs is not None:
            # The echoed prompt's tokens first, scored (OpenAI's shape: null for the first).
            triples = [*prompt_triples(prompt, c.prompt_logprobs), *c.logprobs]
            logprobs = completion_logprobs(tok, triples, as_ids=as_ids)
        elif params.logprobs is not None:
            logprobs = completion_logprobs(tok, c.logprobs, len(prefix), as_ids)
        scores = None
        if body.prompt_logprobs is not None and c.prompt_logprobs is not None:
            scores = prompt_logprobs_field(tok, prompt, c.prompt_logprobs)
        choices.append(
            CompletionChoice(
                index=i,
                text=prefix + c.text,
                logprobs=logprobs,
                finish_reason=c.finish_reason,
                prompt_logprobs=scores,
                prompt_token_ids=prompt if want_ids else None,
                token_ids=c.token_ids if want_ids else None,
            )
        )
    resp = CompletionResponse(
        model=model,
        choices=choices,
        usage=job.usage(),
    )
    return JSONResponse(resp.model_dump(mode="json"))


def _stream(
    job: Job, body: CompletionRequest, model: str, echo: list[str], prompts: list[list[int]]
) -> Response:
    cid = new_completion_id()
    include_usage = body.include_usage
    tok, as_ids = job.state.tokenizer, body.return_tokens_as_token_ids
    n = job.params.n
    want_logprobs = job.params.logprobs is not None
    # return_token_ids: a choice's prompt on its first chunk, its tokens as they go out.
    ids = StreamedTokenIds(len(job.choices)) if body.return_token_ids else None
    unsent_prompt = [True] * len(job.choices)

    def choice(i: int, text: str, **fields: Any) -> CompletionChoice:
        if ids is not None:
            fields["prompt_token_ids"] = prompts[i // n] if unsent_prompt[i] else None
            unsent_prompt[i] = False
            fields["token_ids"] = ids.take(i)
        return CompletionChoice(index=i, text=text, **fields)

    def chunk(choices: list[CompletionChoice]) -> str:
        usage = job.usage() if body.continuous_usage else None
        out = CompletionStreamResponse(id=cid, model=model, choices=choices, usage=usage)
        return out.to_sse(include_usage=include_usage)

    first = []
    if any(echo):
        first = [chunk([choice(i, echo[i // n]) for i in range(len(job.choices))])]

    def render(deltas: list[tuple[int, SequenceDelta]]) -> list[str]:
        choices = []
        for i, d in deltas:
            if ids is not None:
                ids.add(i, d.token_ids)
            logprobs = None
            if want_logprobs and d.logprobs is not None:
                triples = delta_triples(d)
                logprobs = completion_logprobs(tok, triples, as_ids=as_ids)
            if d.text or d.finish_reason or logprobs is not None:
                choices.append(choice(i, d.text, logprobs=logprobs, finish_reason=d.finish_reason))
        return [chunk(choices)] if choices else []

    def last() -> list[str]:
        if not include_usage:
            return []
        final = CompletionStreamResponse(id=cid, model=model, choices=[], usage=job.usage())
        return [final.to_sse(include_usage=True)]

    return stream_response(job, render, first, last)
