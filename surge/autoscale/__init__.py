"""The autoscaler: replicas started and drained from queue depth, KV usage and forecast demand."""
