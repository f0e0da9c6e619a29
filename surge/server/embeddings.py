"""The embedding side of the server: inputs checked and tokenized here, embedded by a one-pass
model behind a dynamic batcher, so that inputs of concurrent requests share model batches.

The model runs in the API process, on the batcher's worker thread (the LLM engine keeps its
own process): an encoder of a few million weights costs less than a hop to another process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from surge.batching import BatcherConfig, BatchStats, DynamicBatcher, QueueFullError
from surge.observability.embedding_metrics import EmbeddingMetrics
from surge.server.errors import BadRequestError, RateLimitError


class EmbeddingModelLike(Protocol):
    """What the service needs of a model (surge.models.embedding.EmbeddingModel has it)."""

    dim: int
    vocab_size: int
    max_len: int

    def tokenize(self, text: str) -> list[int]: ...

    def embed(self, batch: list[list[int]]) -> list[list[float]]: ...

    def describe(self) -> str: ...


def batch_tokens(batch: Sequence[list[int]]) -> int:
    """A batch's cost: its tokens (batches run packed, so padding costs only in attention)."""
    return sum(len(ids) for ids in batch)


class EmbeddingService:
    def __init__(
        self,
        model: EmbeddingModelLike,
        name: str,
        config: BatcherConfig,
        metrics: EmbeddingMetrics,
    ) -> None:
        self.model = model
        self.name = name
        self.metrics = metrics

        def on_batch(stats: BatchStats) -> None:
            metrics.observe_batch(stats.size, stats.queue_wait_s, stats.run_s)

        self.batcher: DynamicBatcher[list[int], list[float]] = DynamicBatcher(
            model.embed, config, batch_cost=batch_tokens, on_batch=on_batch
        )

    def start(self) -> None:
        self.batcher.start()

    async def close(self) -> None:
        await self.batcher.close()

    @property
    def in_flight(self) -> int:
        return self.batcher.in_flight

    def prepare(self, inputs: Sequence[str | list[int]], truncate: int | None) -> list[list[int]]:
        """Token ids per input, or a 400 naming the input at fault. Token-id inputs are taken
        as they are (as vLLM does): they include [CLS]/[SEP] if the caller wants them."""
        if not inputs:
            raise BadRequestError("input must not be empty", param="input")
        limit = self.model.max_len
        if truncate is not None and truncate != -1 and not 1 <= truncate <= limit:
            raise BadRequestError(
                f"truncate_prompt_tokens must be -1 or in 1..{limit}, got {truncate}",
                param="truncate_prompt_tokens",
            )
        keep = limit if truncate == -1 else truncate
        out: list[list[int]] = []
        for i, item in enumerate(inputs):
            param = f"input.{i}" if len(inputs) > 1 else "input"
            ids = self.model.tokenize(item) if isinstance(item, str) else item
            if isinstance(item, str) and not item:
                raise BadRequestError("input must not contain empty strings", param=param)
            if not ids:
                raise BadRequestError("input must not contain empty token lists", param=param)
            if any(not 0 <= t < self.model.vocab_size for t in ids):
                raise BadRequestError(
                    f"token id out of the vocabulary (0..{self.model.vocab_size - 1})",
                    param=param,
                )
            if keep is not None and len(ids) > keep:
                # The first tokens, as sentence-transformers truncates; a tokenized text keeps
                # its closing [SEP].
                ids = ids[: keep - 1] + ids[-1:] if isinstance(item, str) else ids[:keep]
            elif keep is None and len(ids) > limit:
                raise BadRequestError(
                    f"input {i} has {len(ids)} tokens; this model takes at most {limit}. "
                    "Shorten it, or pass truncate_prompt_tokens to keep the first tokens.",
                    param=param,
                    code="context_length_exceeded",
                )
            out.append(ids)
        return out

    async def embed(self, token_ids: list[list[int]]) -> list[list[float]]:
        try:
            vectors = await self.batcher.submit_many(token_ids)
        except QueueFullError as e:
            raise RateLimitError(str(e), retry_after_s=e.retry_after_s, code="queue_full") from e
        self.metrics.observe_request(len(token_ids), batch_tokens(token_ids))
        return vectors
