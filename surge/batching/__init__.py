"""Triton-style dynamic batching for models that answer in one pass (embeddings)."""

from surge.batching.config import BatcherConfig
from surge.batching.dynamic_batcher import BatchStats, DynamicBatcher, QueueFullError

__all__ = ["BatchStats", "BatcherConfig", "DynamicBatcher", "QueueFullError"]
