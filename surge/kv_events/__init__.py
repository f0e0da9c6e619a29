"""The KV-events contract between an engine and whoever indexes its prefix cache.

The engine publishes what enters and leaves its prefix cache (engine/core/kv_publisher.py); a
router (the gateway's KV-aware policy) subscribes and must compute the same block hashes from
a request's tokens. Both sides import the hash function and the wire format from here, since
neither may import the other.
"""
