"""BatcherConfig: when the dynamic batcher sends a batch, and how much it may hold."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BatcherConfig:
    """Triton's `dynamic_batching` block, in seconds. A batch goes out at once when it reaches
    `max_batch_size` (or `max_batch_cost`) or a preferred size; otherwise the batcher waits until
    its oldest item has waited `max_queue_delay_s`, then sends what is there. While a batch runs,
    new items queue up, so a busy model batches even with no delay."""

    max_batch_size: int = 32
    preferred_batch_sizes: tuple[int, ...] = ()  # empty: only max_batch_size sends at once
    max_queue_delay_s: float = 0.0  # Triton's default: a lone input on an idle model goes at once
    max_queue_size: int = 1024  # items waiting; more are refused (QueueFullError -> 503)
    # Bound on a batch's cost, as the batcher's `batch_cost` counts it (for embeddings: its
    # tokens, so that a batch of long inputs stays within a model step's budget). None: none.
    max_batch_cost: int | None = None

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        bad = [p for p in self.preferred_batch_sizes if not 1 <= p <= self.max_batch_size]
        if bad:
            raise ValueError(
                f"preferred batch sizes must be in 1..max_batch_size ({self.max_batch_size}), "
                f"got {bad}"
            )
        if self.max_queue_delay_s < 0:
            raise ValueError(f"max_queue_delay_s must be >= 0, got {self.max_queue_delay_s}")
        if self.max_queue_size < 1:
            raise ValueError(f"max_queue_size must be >= 1, got {self.max_queue_size}")
        if self.max_batch_cost is not None and self.max_batch_cost < 1:
            raise ValueError(f"max_batch_cost must be >= 1, got {self.max_batch_cost}")
