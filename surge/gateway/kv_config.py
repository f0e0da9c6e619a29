"""KvConfig: routing by the KV blocks each replica reports holding (`--policy kv_aware`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from surge.config.flags import flag


@dataclass(frozen=True, slots=True)
class KvConfig:
    """The replicas publish their prefix caches' KV events (`surge serve --kv-events-endpoint`)
    and advertise where on GET /version; the gateway tokenizes each request as they do and
    counts, per replica, the leading blocks of it that replica holds. Too-busy replicas are
    passed over by the prefix group's balance thresholds (--balance-abs, --balance-rel)."""

    tokenizer: str = field(
        default="smollm2-135m",
        metadata=flag(
            "the replicas' model (alias, GGUF file or HF folder): its tokenizer and chat "
            "template, read here, give the request's tokens",
            name="kv-tokenizer",
        ),
    )
    # a request longer than this is hashed up to here only (the cost of a pick stays bounded)
    max_tokens: int = field(
        default=32_768, metadata=flag("tokens of a prompt looked up at most", name="kv-max-tokens")
    )

    # A routed prompt's blocks count as held by its replica this long, or until that replica's
    # events store or remove them (kv_index.py: the prefill's own delay otherwise scatters a
    # new prefix sent several times at once).
    routed_ttl_s: float = field(
        default=10.0,
        metadata=flag(
            "seconds a routed prompt's blocks count as held by its replica before its KV "
            "events confirm them (0: only what the events say)",
            name="kv-routed-ttl",
        ),
    )

    def __post_init__(self) -> None:
        if not self.tokenizer:
            raise ValueError("kv.tokenizer must name a model")
        if self.max_tokens < 1:
            raise ValueError(f"kv.max_tokens must be >= 1, got {self.max_tokens}")
        if self.routed_ttl_s < 0:
            raise ValueError(f"kv.routed_ttl_s must be >= 0, got {self.routed_ttl_s}")
