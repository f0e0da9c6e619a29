"""Saturation and what to do about it: cap max_tokens, go to the fallback group, or shed.

Pure decisions over snapshots; the app applies them and says what it did in the
`x-surge-degraded` response header.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from surge.gateway.config import DegradeAction, DegradeConfig
from surge.gateway.upstreams import UpstreamSnapshot

DEGRADED_HEADER = "x-surge-degraded"


def is_saturated(s: UpstreamSnapshot, config: DegradeConfig) -> bool:
    """At its in-flight limit, or reporting a queue longer than `max_waiting`."""
    if s.max_in_flight is not None and s.in_flight >= s.max_in_flight:
        return True
    return (
        config.max_waiting is not None
        and s.num_waiting is not None
        and s.num_waiting > config.max_waiting
    )


def all_saturated(snapshots: Sequence[UpstreamSnapshot], config: DegradeConfig) -> bool:
    return bool(snapshots) and all(is_saturated(s, config) for s in snapshots)


@dataclass(frozen=True, slots=True)
class Decision:
    action: DegradeAction  # NONE: route as usual
    header: str | None = None  # x-surge-degraded value


NOT_DEGRADED = Decision(DegradeAction.NONE)


def decide(
    primary: Sequence[UpstreamSnapshot],
    fallback: Sequence[UpstreamSnapshot],
    config: DegradeConfig,
) -> Decision:
    """What to do with one request, given the candidates of both groups right now.

    Nothing while some primary upstream has room (or there are none: that is an outage, for
    the proxy to report, not saturation). The fallback action sheds when the fallback group is
    empty or saturated too.
    """
    if config.action is DegradeAction.NONE or not all_saturated(primary, config):
        return NOT_DEGRADED
    if config.action is DegradeAction.CAP_MAX_TOKENS:
        return Decision(DegradeAction.CAP_MAX_TOKENS, f"max_tokens={config.max_tokens_cap}")
    if config.action is DegradeAction.FALLBACK and fallback and not all_saturated(fallback, config):
        return Decision(DegradeAction.FALLBACK, "fallback")
    return Decision(DegradeAction.SHED, "shed")


def cap_max_tokens(body: dict[str, Any], cap: int) -> dict[str, Any]:
    """A copy of the body asking for at most `cap` tokens (both OpenAI spellings)."""
    out = dict(body)
    if "input" in body:  # the Responses API has one spelling
        value = out.get("max_output_tokens")
        if not (isinstance(value, int) and not isinstance(value, bool) and value <= cap):
            out["max_output_tokens"] = cap
        return out
    for name in ("max_tokens", "max_completion_tokens"):
        value = out.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value <= cap:
            continue
        # max_tokens always (an absent one means "up to the context"); the newer spelling
        # only where the client used it, since it takes precedence on the server.
        if name == "max_tokens" or value is not None:
            out[name] = cap
    return out
