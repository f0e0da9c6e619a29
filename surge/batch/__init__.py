"""OpenAI's Batch API (/v1/files, /v1/batches) for `surge serve` and `surge gateway`: durable
in SQLite, run behind real-time traffic at the lowest priority (docs/batch.md)."""
