"""Logprobs in the two OpenAI shapes (completions and chat), from (token, logprob, top) triples."""

from __future__ import annotations

from collections.abc import Sequence

from surge.models.tokenizer import Tokenizer
from surge.server.protocol_responses import (
    ChatChoiceLogProbs,
    ChatLogProb,
    ChatLogProbsContent,
    CompletionLogProbs,
)

Triple = tuple[int, float, tuple[tuple[int, float], ...]]


def token_text(tok: Tokenizer, token_id: int) -> str:
    return tok.decode([token_id], skip_special_tokens=False)


def completion_logprobs(
    tok: Tokenizer, triples: Sequence[Triple], text_offset: int = 0
) -> CompletionLogProbs:
    out = CompletionLogProbs()
    offset = text_offset
    for token_id, logprob, top in triples:
        text = token_text(tok, token_id)
        out.tokens.append(text)
        out.token_logprobs.append(logprob)
        out.top_logprobs.append({token_text(tok, t): lp for t, lp in top})
        out.text_offset.append(offset)
        offset += len(text)
    return out


def chat_logprobs(tok: Tokenizer, triples: Sequence[Triple]) -> ChatChoiceLogProbs:
    content = []
    for token_id, logprob, top in triples:
        text = token_text(tok, token_id)
        content.append(
            ChatLogProbsContent(
                token=text,
                logprob=logprob,
                bytes=list(text.encode("utf-8")),
                top_logprobs=[
                    ChatLogProb(
                        token=token_text(tok, t),
                        logprob=lp,
                        bytes=list(token_text(tok, t).encode("utf-8")),
                    )
                    for t, lp in top
                ],
            )
        )
    return ChatChoiceLogProbs(content=content)
