"""BatcherConfig: when the dynamic batcher sends a batch, and how much it may hold."""

from __future__ import annotations

from dataclasses import dataclass, field

from surge.config.flags import flag


def parse_int_list(text: str) -> tuple[int, ...]:
    """ "8,16" -> (8, 16); "" -> ()."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SystemExit(f"expected comma-separated integers, got {text!r}") from None


def _ms_to_s(ms: float) -> float:
    return ms / 1e3


@dataclass(frozen=True, slots=True)
class BatcherConfig:
    """Triton's `dynamic_batching` block, in seconds. A batch goes out at once when it reaches
    `max_batch_size` (or `max_batch_cost`) or a preferred size; otherwise the batcher waits until
    its oldest item has waited `max_queue_delay_s`, then sends what is there. While a batch runs,
    new items queue up, so a busy model batches even with no delay. The flags (named with the
    user's prefix, e.g. --embedding-max-batch-size) speak of tokens: embeddings' batch cost."""

    max_batch_size: int = field(default=32, metadata=flag())
    # empty: only max_batch_size sends at once
    preferred_batch_sizes: tuple[int, ...] = field(
        default=(),
        metadata=flag(
            "comma-separated sizes sent at once when reached, e.g. 8,16 (default: none)",
            default="",
            to_field=parse_int_list,
        ),
    )
    # Triton's default: a lone input on an idle model goes at once
    max_queue_delay_s: float = field(
        default=0.0,
        metadata=flag(
            "longest an input waits for a fuller batch (default 0: inputs that arrive while "
            "a batch runs make the next batch; a delay only adds latency to a busy model)",
            name="max-queue-delay-ms",
            to_field=_ms_to_s,
        ),
    )
    # items waiting; more are refused (QueueFullError -> 503)
    max_queue_size: int = field(default=1024, metadata=flag("inputs waiting"))
    # Bound on a batch's cost, as the batcher's `batch_cost` counts it (for embeddings: its
    # tokens, so that a batch of long inputs stays within a model step's budget). None: none.
    max_batch_cost: int | None = field(
        default=None,
        metadata=flag("bound on a batch's tokens (default: none)", name="max-batch-tokens"),
    )

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
