"""POST /v1/chat/completions: messages rendered with the model's chat template, stream or not."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from surge.engine.client.output_processor import SequenceDelta
from surge.server.errors import BadRequestError
from surge.server.openapi import ADMITTED, with_200
from surge.server.protocol import ChatCompletionRequest
from surge.server.protocol_responses import (
    ChatCompletionChoice,
    ChatCompletionResponse,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    ChatResponseMessage,
    DeltaMessage,
    new_chat_completion_id,
)
from surge.server.protocol_tokenize import TokenizeRequest
from surge.server.reasoning import END as THINK_END
from surge.server.reasoning import START as THINK_START
from surge.server.reasoning import ReasoningParser, ReasoningStream
from surge.server.routes.logprobs import chat_logprobs, prompt_logprobs_field
from surge.server.serving import (
    Job,
    StreamedTokenIds,
    delta_triples,
    run_to_completion,
    start_job,
    stream_response,
)
from surge.server.state import ServerState, get_state
from surge.server.tool_parsers import ToolCallStream, ToolParser
from surge.server.tool_parsers.prompt import with_tools_prompt
from surge.server.tools import ToolCall, ToolPlan, new_call_id, tool_calls_finish_reason

router = APIRouter()


def render_text(state: ServerState, body: ChatCompletionRequest | TokenizeRequest) -> str:
    """The conversation as the chat template writes it, with the request's tools (in the tool
    parser's syntax when the template shows none) and, with continue_final_message, cut just
    after the last message's text so that the model writes on from there."""
    tok = state.tokenizer
    kwargs = dict(body.chat_template_kwargs or {})
    if body.reasoning_effort is not None:  # as vLLM: a variable of the template's
        kwargs.setdefault("reasoning_effort", body.reasoning_effort)
    messages, tools = body.template_messages(), body.template_tools()
    if state.tool_parser is not None and not state.template_renders_tools:
        # The template knows no tools: the parser's syntax carries them (tool_parsers/prompt.py).
        messages = with_tools_prompt(state.tool_parser(()), messages, tools)
    elif tools is not None:
        kwargs.setdefault("tools", tools)
    try:
        text = tok.apply_chat_template(
            messages, add_generation_prompt=body.add_generation_prompt, **kwargs
        )
    except ValueError as e:
        raise BadRequestError(f"cannot apply the chat template: {e}", param="messages") from e
    if body.continue_final_message:
        final = str(messages[-1].get("content") or "")
        for needle in (final, final.strip()):
            if needle and (end := text.rfind(needle)) >= 0:
                return text[: end + len(needle)]
        raise BadRequestError(
            "continue_final_message: the chat template does not write the final message's "
            "text as given",
            param="messages",
        )
    return text


@dataclass(frozen=True, slots=True)
class ChatJob:
    """An admitted chat request, and how its text is read back (tool calls)."""

    job: Job
    prompt: list[int]
    plan: ToolPlan | None  # tool_choice "required" or a named function: a constraint
    parser: ToolParser | None  # tool_choice "auto" with a parser: calls read from the text
    thinking: ReasoningParser | None = None  # --reasoning-parser: thinking read apart
    prompt_opens: bool = False  # the prompt ends in <think>: the model starts thinking

    def split(self, text: str) -> tuple[str | None, str]:
        """A finished text's reasoning (None without any) and the rest."""
        if self.thinking is None:
            return None, text
        reasoning, rest = self.thinking.split(text, True, self.prompt_opens)
        return reasoning or None, rest

    def read_calls(self, rest: str) -> tuple[str | None, list[ToolCall]]:
        """The content and tool calls of a finished text's answer (`split`'s rest)."""
        reader = self.plan or self.parser
        return (rest, []) if reader is None else reader.answer(rest)

    def answer(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """The content and tool calls of a finished text (after any reasoning)."""
        return self.read_calls(self.split(text)[1])

    def reasoning_streams(self) -> list[ReasoningStream] | None:
        if self.thinking is None:
            return None
        return [ReasoningStream(self.thinking, self.prompt_opens) for _ in self.job.choices]


def start_chat(
    state: ServerState, body: ChatCompletionRequest, request: Request, param: str = "messages"
) -> ChatJob:
    """Render, check and admit a chat request (also what /v1/responses runs)."""
    lora_name = state.check_model(body.model)
    text = render_text(state, body)
    # The template writes any BOS itself: don't add special tokens again.
    prompt = state.tokenizer.encode(text, add_special_tokens=False)
    room = body.context_room([len(prompt)], state.max_model_len, param=param)
    plan = body.tool_plan(auto_tools=state.tool_parser is not None)
    params = body.to_sampling_params(
        room=room,
        default_max_tokens=state.default_max_tokens,
        plan=plan,
        defaults=state.sampling_defaults,
    )
    opens = state.reasoning is not None and text.rstrip().endswith(THINK_START)
    if state.reasoning is not None and (structured := params.structured) is not None:
        # A reasoning model thinks first: the constraint holds from its `</think>` on. Not
        # where the prompt closed the thinking already (Qwen3's enable_thinking: false), nor
        # where the constraint writes `</think>` itself (it shapes the thinking too).
        closed = text.rstrip().endswith(THINK_END) or THINK_END in structured.spec
        if not closed:
            first = state.reasoning.thinks_first or opens
            thinking = replace(structured, thinking="first" if first else "optional")
            params = replace(params, structured=thinking)
    job = start_job(
        state,
        request,
        [prompt],
        params,
        request_id=body.request_id,
        user=body.user,
        priority=body.priority if "priority" in body.model_fields_set else None,
        cache_salt=body.cache_salt,
        operation="chat",
        lora_name=lora_name,
    )
    return ChatJob(job, prompt, plan, _auto_parser(state, body), state.reasoning, opens)


@router.post(
    "/v1/chat/completions",
    response_model=None,
    responses=with_200(ChatCompletionResponse, stream=True) | ADMITTED,
)
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    state = get_state(request)
    chat = start_chat(state, body, request)
    job, prompt, params = chat.job, chat.prompt, chat.job.params
    model = body.model or state.config.served_model_name
    if body.stream:
        return _stream(chat, body, model)
    if not await run_to_completion(job, request):
        return Response(status_code=499)
    tok, as_ids, ids = state.tokenizer, body.return_tokens_as_token_ids, body.return_token_ids
    choices = []
    for i, c in enumerate(job.choices):
        logprobs = None if params.logprobs is None else chat_logprobs(tok, c.logprobs, as_ids)
        reasoning, rest = chat.split(c.text)
        message = ChatResponseMessage(content=rest, reasoning=reasoning)
        finish_reason = c.finish_reason
        content, calls = chat.read_calls(rest)
        if calls:
            tool_calls = [t.to_openai() for t in calls]
            message = ChatResponseMessage(
                content=content, reasoning=reasoning, tool_calls=tool_calls
            )
            finish_reason = tool_calls_finish_reason(c.finish_reason)
        choices.append(
            ChatCompletionChoice(
                index=i,
                message=message,
                logprobs=logprobs,
                finish_reason=finish_reason,
                token_ids=c.token_ids if ids else None,
            )
        )
    scores = job.choices[0].prompt_logprobs if body.prompt_logprobs is not None else None
    resp = ChatCompletionResponse(
        model=model,
        choices=choices,
        usage=job.usage(),
        prompt_logprobs=None if scores is None else prompt_logprobs_field(tok, prompt, scores),
        prompt_token_ids=prompt if ids else None,
    )
    return JSONResponse(resp.model_dump(mode="json"))


def _auto_parser(state: ServerState, body: ChatCompletionRequest) -> ToolParser | None:
    """The parser that reads tool calls back when the model may choose to make them."""
    if state.tool_parser is None or not body.auto_tools():
        return None
    return state.tool_parser([t.function.name for t in body.tools or ()])


def _stream(chat: ChatJob, body: ChatCompletionRequest, model: str) -> Response:
    job, plan, parser = chat.job, chat.plan, chat.parser
    cid = new_chat_completion_id()
    include_usage = body.include_usage
    tok, as_ids = job.state.tokenizer, body.return_tokens_as_token_ids
    want_logprobs = job.params.logprobs is not None
    ids = StreamedTokenIds(len(job.choices)) if body.return_token_ids else None

    def take(i: int) -> list[int] | None:
        return None if ids is None else ids.take(i)

    # A named function's arguments stream as they come; a "required" list is sent whole at the
    # end, when it parses.
    call_ids = [new_call_id() for _ in job.choices]
    streams_arguments = plan is not None and plan.named is not None
    calls = None if parser is None else [ToolCallStream(parser) for _ in job.choices]
    thinking = chat.reasoning_streams()

    def chunk(choices: list[ChatCompletionStreamChoice], prompt: list[int] | None = None) -> str:
        usage = job.usage() if body.continuous_usage else None
        out = ChatCompletionStreamResponse(
            id=cid, model=model, choices=choices, usage=usage, prompt_token_ids=prompt
        )
        return out.to_sse(include_usage=include_usage)

    def opening(i: int) -> DeltaMessage:
        if streams_arguments:
            assert plan is not None and plan.named is not None
            call = ToolCall(plan.named, "", call_ids[i]).to_openai(index=0)
            return DeltaMessage(role="assistant", tool_calls=[call])
        return DeltaMessage(role="assistant", content="")

    prompt_ids = chat.prompt if body.return_token_ids else None
    first = [
        chunk([ChatCompletionStreamChoice(index=i, delta=opening(i))], None if i else prompt_ids)
        for i in range(len(job.choices))
    ]

    def render(deltas: list[tuple[int, SequenceDelta]]) -> list[str]:
        out = []
        for i, d in deltas:
            if ids is not None:
                ids.add(i, d.token_ids)
            logprobs = None
            if want_logprobs and d.logprobs is not None:
                triples = delta_triples(d)
                logprobs = chat_logprobs(tok, triples, as_ids)
            text, fresh, thought = job.choices[i].text, d.text, ""
            if thinking is not None:  # the reasoning apart; the rest is what follows
                thought, fresh = thinking[i].update(text, d.finish_reason is not None)
                text = thinking[i].content
            if calls is not None:
                content, pieces = calls[i].update(text, d.finish_reason is not None)
                if content or pieces or thought or logprobs is not None:
                    delta = DeltaMessage(
                        reasoning=thought or None,
                        content=content or None,
                        tool_calls=pieces or None,
                    )
                    choice = ChatCompletionStreamChoice(
                        index=i, delta=delta, logprobs=logprobs, token_ids=take(i)
                    )
                    out.append(chunk([choice]))
            elif plan is None and (fresh or thought or logprobs is not None):
                said = fresh if thinking is None else fresh or None
                delta = DeltaMessage(reasoning=thought or None, content=said)
                out.append(
                    chunk(
                        [
                            ChatCompletionStreamChoice(
                                index=i, delta=delta, logprobs=logprobs, token_ids=take(i)
                            )
                        ]
                    )
                )
            elif streams_arguments and d.text:
                delta = DeltaMessage(tool_calls=[{"index": 0, "function": {"arguments": d.text}}])
                out.append(
                    chunk(
                        [
                            ChatCompletionStreamChoice(
                                index=i, delta=delta, logprobs=logprobs, token_ids=take(i)
                            )
                        ]
                    )
                )
            if d.finish_reason is not None:
                reason = d.finish_reason
                if plan is not None:
                    out += _closing(plan, job.choices[i].text, i, chunk, streams_arguments)
                    reason = plan.finish_reason(d.finish_reason) or reason
                elif calls is not None and calls[i].called:
                    reason = tool_calls_finish_reason(reason) or reason
                out.append(
                    chunk(
                        [
                            ChatCompletionStreamChoice(
                                index=i, finish_reason=reason, token_ids=take(i)
                            )
                        ]
                    )
                )
        return out

    def last() -> list[str]:
        if not include_usage:
            return []
        final = ChatCompletionStreamResponse(id=cid, model=model, choices=[], usage=job.usage())
        return [final.to_sse(include_usage=True)]

    return stream_response(job, render, first, last)


def _closing(
    plan: ToolPlan,
    text: str,
    i: int,
    chunk: Callable[[list[ChatCompletionStreamChoice]], str],
    streamed: bool,
) -> list[str]:
    """What a tool-call choice sends when it ends: a "required" list's calls, whole."""
    if streamed:
        return []
    content, calls = plan.answer(text)
    if calls:
        delta = DeltaMessage(tool_calls=[t.to_openai(index=k) for k, t in enumerate(calls)])
    else:
        delta = DeltaMessage(content=content)
    return [chunk([ChatCompletionStreamChoice(index=i, delta=delta)])]
