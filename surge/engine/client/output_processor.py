"""Front-end side of a request: fans n > 1 out into sequences, detokenizes, applies stop strings.

Lives in the API process (or in-process for the offline LLM). Token-level stops (EOS, max_tokens)
are the core's; stop strings are found here on text, and the core is told to abort the sequence.
Text that could be the start of a stop string is held back, so a stop string is never emitted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from surge.engine.client.detokenizer import IncrementalDetokenizer
from surge.engine.client.outputs import (
    EngineCoreOutput,
    EngineCoreRequest,
    FinishReason,
    TokenLogprob,
)
from surge.models.formats.tokenizer import Tokenizer
from surge.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class SequenceDelta:
    """What one sequence of a request produced in one step."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None
    finish_reason: str | None = None
    stop_reason: str | int | None = None  # the stop string or stop token that ended it
    prompt_logprobs: list[TokenLogprob] | None = None  # with a sequence's first delta


@dataclass(slots=True)
class RequestDelta:
    req_id: str
    deltas: list[SequenceDelta]
    finished: bool  # every sequence of the request is done
    num_prompt_tokens: int
    num_cached_tokens: int
    queue_time_s: float


@dataclass(slots=True)
class _Sequence:
    parent: _Parent
    index: int
    detok: IncrementalDetokenizer
    params: SamplingParams
    held: str = ""  # text not yet emitted: it may be the start of a stop string
    num_tokens: int = 0
    finished: bool = False


@dataclass(slots=True)
class _Parent:
    req_id: str
    num_prompt_tokens: int
    num_unfinished: int
    num_cached_tokens: int = 0
    queue_time_s: float = 0.0
    children: list[str] = field(default_factory=list)


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._seqs: dict[str, _Sequence] = {}
        self._parents: dict[str, _Parent] = {}

    def add(
        self,
        req_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        arrival_s: float | None = None,
        priority: int = 0,
        tenant: str = "",
        cache_salt: str | None = None,
        lora_name: str | None = None,
    ) -> list[EngineCoreRequest]:
        """Register a request; return the core requests to send (one per sequence)."""
        if req_id in self._parents:
            raise ValueError(f"duplicate request id {req_id!r}")
        n = params.n
        parent = _Parent(req_id, len(prompt_token_ids), n)
        self._parents[req_id] = parent
        out = []
        for k in range(n):
            child = req_id if n == 1 else f"{req_id}#{k}"
            detok = IncrementalDetokenizer(
                self.tokenizer, prompt_token_ids, params.skip_special_tokens
            )
            self._seqs[child] = _Sequence(parent, k, detok, params)
            parent.children.append(child)
            seed = None if params.seed is None else params.seed + k
            out.append(
                EngineCoreRequest(
                    req_id=child,
                    prompt_token_ids=prompt_token_ids,
                    params=params,
                    arrival_s=arrival_s,
                    seed=seed,
                    priority=priority,
                    tenant=tenant,
                    cache_salt=cache_salt,
                    share_prompt_with=None if k == 0 else parent.children[0],
                    lora_name=lora_name,
                )
            )
        return out

    def child_ids(self, req_id: str) -> list[str]:
        parent = self._parents.get(req_id)
        return list(parent.children) if parent else []

    def parent_of(self, seq_id: str) -> str | None:
        seq = self._seqs.get(seq_id)
        return seq.parent.req_id if seq else None

    def remove(self, req_id: str) -> list[str]:
        """Forget a request (aborted by the caller); return its unfinished sequence ids."""
        parent = self._parents.pop(req_id, None)
        if parent is None:
            return []
        live = [c for c in parent.children if c in self._seqs and not self._seqs[c].finished]
        for c in parent.children:
            self._seqs.pop(c, None)
        return live

    def process(self, outputs: list[EngineCoreOutput]) -> tuple[list[RequestDelta], list[str]]:
        """Turn core outputs into per-request deltas; also return sequences to abort (stop hit)."""
        by_parent: dict[str, RequestDelta] = {}
        to_abort: list[str] = []
        for out in outputs:
            seq = self._seqs.get(out.req_id)
            if seq is None or seq.finished:
                continue  # aborted or already stopped by a stop string
            parent = seq.parent
            if seq.num_tokens == 0:
                parent.num_cached_tokens = max(parent.num_cached_tokens, out.num_cached_tokens)
                parent.queue_time_s = max(parent.queue_time_s, out.queue_time_s)
            delta = self._advance(seq, out)
            if delta.finish_reason is not None and out.finish_reason is None:
                to_abort.append(out.req_id)  # a stop string: the core still runs it
            rd = by_parent.get(parent.req_id)
            if rd is None:
                rd = RequestDelta(
                    parent.req_id,
                    [],
                    False,
                    parent.num_prompt_tokens,
                    parent.num_cached_tokens,
                    parent.queue_time_s,
                )
                by_parent[parent.req_id] = rd
            rd.deltas.append(delta)
            if delta.finish_reason is not None:
                seq.finished = True
                parent.num_unfinished -= 1
                if parent.num_unfinished == 0:
                    rd.finished = True
                    self._parents.pop(parent.req_id, None)
                    for c in parent.children:
                        self._seqs.pop(c, None)
        return list(by_parent.values()), to_abort

    def _advance(self, seq: _Sequence, out: EngineCoreOutput) -> SequenceDelta:
        params = seq.params
        text = seq.held
        tokens = list(out.new_token_ids)
        for i, tok in enumerate(out.new_token_ids):
            text += seq.detok.add(tok)
            if params.stop and i + 1 < len(tokens) and _find_stop(text, params.stop):
                # Several tokens (an accepted speculative draft) and a stop string before the
                # last: the output ends at the token that completed it, as without drafts.
                tokens = tokens[: i + 1]
                break
        logprobs = out.new_logprobs[: len(tokens)] if out.new_logprobs is not None else None
        seq.num_tokens += len(tokens)
        finish: str | None = out.finish_reason.value if out.finish_reason else None
        stop_reason: str | int | None = None
        if out.finish_reason is FinishReason.STOP and out.new_token_ids:
            last = out.new_token_ids[-1]
            if last in params.stop_token_ids:
                stop_reason = last
        if finish is not None:
            text += seq.detok.flush()
        if params.stop:
            hit = _find_stop(text, params.stop)
            if hit is not None:
                pos, stop = hit
                text = text[: pos + len(stop)] if params.include_stop_str_in_output else text[:pos]
                finish, stop_reason = FinishReason.STOP.value, stop
        if finish is None and params.stop:
            # Hold back a tail that could still grow into a stop string.
            keep = _partial_stop_len(text, params.stop)
            seq.held = text[len(text) - keep :] if keep else ""
            text = text[: len(text) - keep]
        else:
            seq.held = ""
        return SequenceDelta(
            seq.index, text, tokens, logprobs, finish, stop_reason, out.prompt_logprobs
        )


def _find_stop(text: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    best: tuple[int, str] | None = None
    for s in stops:
        pos = text.find(s)
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, s)
    return best


def _partial_stop_len(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest tail of text that is a proper prefix of some stop string."""
    longest = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:k]):
                longest = k
                break
    return longest
