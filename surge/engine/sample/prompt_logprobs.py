"""Prompt logprobs (vLLM's `prompt_logprobs`, OpenAI's `echo` with `logprobs`): how likely the
model found each prompt token after the ones before it, from the logits of prefill positions."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from surge.engine.client.outputs import TokenLogprob
from surge.engine.core.batch import ScheduledRequest


def score_prompts(
    logits: Tensor, scored: Sequence[ScheduledRequest]
) -> dict[str, list[TokenLogprob]]:
    """logits [rows, vocab]: one row per entry of `scored`, in the order the runner laid them
    out (each request's rows consecutive, scoring its prompt_targets in order)."""
    if not scored:
        return {}
    targets: list[int] = []
    seen: set[str] = set()
    for r in scored:
        if r.req_id not in seen:
            seen.add(r.req_id)
            targets += r.prompt_targets
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [rows, vocab]
    index = torch.tensor(targets, device=logits.device).unsqueeze(1)
    chosen = logprobs.gather(1, index)  # [rows, 1]
    ranks = (logprobs > chosen).sum(dim=1) + 1
    k = max(r.prompt_top for r in scored)
    top_vals, top_ids = logprobs.topk(k, dim=-1) if k else (logprobs[:, :0], index[:, :0])
    rows = zip(
        chosen.squeeze(1).tolist(),
        ranks.tolist(),
        top_ids.tolist(),
        top_vals.tolist(),
        strict=True,
    )
    out: dict[str, list[TokenLogprob]] = {}
    for r, (lp, rank, ids, vals) in zip(scored, rows, strict=True):
        top = tuple(zip(ids, vals, strict=True))[: r.prompt_top]
        out.setdefault(r.req_id, []).append(TokenLogprob(lp, top, rank))
    return out
