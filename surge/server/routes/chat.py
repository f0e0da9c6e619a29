"""POST /v1/chat/completions: messages rendered with the model's chat template, stream or not."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from surge.engine.output_processor import SequenceDelta
from surge.server.errors import BadRequestError
from surge.server.protocol import ChatCompletionRequest, check_context_length
from surge.server.protocol_responses import (
    ChatCompletionChoice,
    ChatCompletionResponse,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    ChatResponseMessage,
    DeltaMessage,
    new_chat_completion_id,
)
from surge.server.routes.logprobs import chat_logprobs
from surge.server.serving import (
    Job,
    delta_triples,
    run_to_completion,
    start_job,
    stream_response,
)
from surge.server.state import ServerState, get_state

router = APIRouter()


def render_prompt(state: ServerState, body: ChatCompletionRequest) -> list[int]:
    tok = state.tokenizer
    try:
        text = tok.apply_chat_template(
            body.template_messages(),
            add_generation_prompt=body.add_generation_prompt,
            **(body.chat_template_kwargs or {}),
        )
    except ValueError as e:
        raise BadRequestError(f"cannot apply the chat template: {e}", param="messages") from e
    # The template writes any BOS itself: don't add special tokens again.
    return tok.encode(text, add_special_tokens=False)


@router.post("/v1/chat/completions", response_model=None)
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    state = get_state(request)
    state.check_model(body.model)
    prompt = render_prompt(state, body)
    max_tokens = (
        body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    )
    check_context_length(len(prompt), max_tokens, state.max_model_len, param="messages")
    room = state.max_model_len - len(prompt)
    default = room if state.config.default_max_tokens is None else state.config.default_max_tokens
    params = body.to_sampling_params(default_max_tokens=min(default, room))
    job = start_job(
        state, request, [prompt], params, request_id=body.request_id, user=body.user,
        priority=body.priority if "priority" in body.model_fields_set else None,
        cache_salt=body.cache_salt, operation="chat",
    )  # fmt: skip
    model = body.model or state.config.served_model_name
    if body.stream:
        return _stream(job, body, model)
    if not await run_to_completion(job, request):
        return Response(status_code=499)
    tok = state.tokenizer
    choices = []
    for i, c in enumerate(job.choices):
        logprobs = chat_logprobs(tok, c.logprobs) if params.logprobs is not None else None
        choices.append(
            ChatCompletionChoice(
                index=i,
                message=ChatResponseMessage(content=c.text),
                logprobs=logprobs,
                finish_reason=c.finish_reason,
            )
        )
    resp = ChatCompletionResponse(model=model, choices=choices, usage=job.usage())
    return JSONResponse(resp.model_dump(mode="json"))


def _stream(job: Job, body: ChatCompletionRequest, model: str) -> Response:
    cid = new_chat_completion_id()
    include_usage = body.include_usage
    tok = job.state.tokenizer
    want_logprobs = job.params.logprobs is not None

    def chunk(choices: list[ChatCompletionStreamChoice]) -> str:
        return ChatCompletionStreamResponse(id=cid, model=model, choices=choices).to_sse(
            include_usage=include_usage
        )

    first = [
        chunk(
            [
                ChatCompletionStreamChoice(
                    index=i, delta=DeltaMessage(role="assistant", content="")
                )
                for i in range(len(job.choices))
            ]
        )
    ]

    def render(deltas: list[tuple[int, SequenceDelta]]) -> list[str]:
        out = []
        for i, d in deltas:
            logprobs = None
            if want_logprobs and d.logprobs is not None:
                triples = delta_triples(d)
                logprobs = chat_logprobs(tok, triples)
            if d.text or logprobs is not None:
                delta = DeltaMessage(content=d.text)
                out.append(
                    chunk([ChatCompletionStreamChoice(index=i, delta=delta, logprobs=logprobs)])
                )
            if d.finish_reason is not None:
                out.append(
                    chunk([ChatCompletionStreamChoice(index=i, finish_reason=d.finish_reason)])
                )
        return out

    def last() -> list[str]:
        if not include_usage:
            return []
        final = ChatCompletionStreamResponse(id=cid, model=model, choices=[], usage=job.usage())
        return [final.to_sse(include_usage=True)]

    return stream_response(job, render, first, last)
