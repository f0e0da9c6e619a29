"""Logprobs in the two OpenAI shapes (completions and chat), from (token, logprob, top) triples."""

from __future__ import annotations

from collections.abc import Sequence

from surge.engine.client.outputs import TokenLogprob
from surge.models.formats.tokenizer import Tokenizer
from surge.server.protocol_responses import (
    ChatChoiceLogProbs,
    ChatLogProb,
    ChatLogProbsContent,
    CompletionLogProbs,
    PromptLogprobs,
)

Triple = tuple[int, float, tuple[tuple[int, float], ...]]
# A completion's logprobs with echo: the first prompt token has neither logprob nor alternatives.
EchoTriple = tuple[int, float | None, tuple[tuple[int, float], ...] | None]


def token_text(tok: Tokenizer, token_id: int, as_id: bool = False) -> str:
    """A token as logprobs name it: its text, or vLLM's "token_id:{id}" (as_id: the request's
    return_tokens_as_token_ids, for tokens whose text is not a whole character)."""
    return f"token_id:{token_id}" if as_id else tok.decode([token_id], skip_special_tokens=False)


def completion_logprobs(
    tok: Tokenizer, triples: Sequence[EchoTriple], text_offset: int = 0, as_ids: bool = False
) -> CompletionLogProbs:
    out = CompletionLogProbs()
    offset = text_offset
    for token_id, logprob, top in triples:
        text = token_text(tok, token_id, as_ids)
        out.tokens.append(text)
        out.token_logprobs.append(logprob)
        out.top_logprobs.append(
            None if top is None else {token_text(tok, t, as_ids): lp for t, lp in top}
        )
        out.text_offset.append(offset)
        offset += len(text)
    return out


def prompt_triples(prompt: Sequence[int], scores: Sequence[TokenLogprob]) -> list[EchoTriple]:
    """The prompt as (token, logprob, top) for an echo with logprobs: the first token has
    none (OpenAI's null), each later one its score given the tokens before it."""
    first: list[EchoTriple] = [(prompt[0], None, None)] if prompt else []
    return first + [(t, s.logprob, s.top) for t, s in zip(prompt[1:], scores, strict=True)]


def prompt_logprobs_field(
    tok: Tokenizer, prompt: Sequence[int], scores: Sequence[TokenLogprob]
) -> PromptLogprobs:
    """vLLM's `prompt_logprobs`: None for the first token, then {token id: {logprob, rank,
    decoded_token}} for the token itself and its top alternatives."""
    out: PromptLogprobs = [None]
    for token_id, s in zip(prompt[1:], scores, strict=True):
        entry = {
            str(t): {"logprob": lp, "rank": rank, "decoded_token": token_text(tok, t)}
            for rank, (t, lp) in enumerate(s.top, start=1)
        }
        entry[str(token_id)] = {
            "logprob": s.logprob,
            "rank": s.rank,
            "decoded_token": token_text(tok, token_id),
        }
        out.append(entry)
    return out


def chat_logprobs(
    tok: Tokenizer, triples: Sequence[Triple], as_ids: bool = False
) -> ChatChoiceLogProbs:
    content = []
    for token_id, logprob, top in triples:
        text = token_text(tok, token_id, as_ids)
        content.append(
            ChatLogProbsContent(
                token=text,
                logprob=logprob,
                bytes=list(text.encode("utf-8")),
                top_logprobs=[
                    ChatLogProb(
                        token=token_text(tok, t, as_ids),
                        logprob=lp,
                        bytes=list(token_text(tok, t, as_ids).encode("utf-8")),
                    )
                    for t, lp in top
                ],
            )
        )
    return ChatChoiceLogProbs(content=content)
