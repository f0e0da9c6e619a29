"""A request's own deadline, in seconds, in one header: a client sets it, the gateway honours it
and passes on the time left, the server ends the request when it passes."""

from __future__ import annotations

import math

TIMEOUT_HEADER = "x-surge-timeout"


def parse_timeout(raw: str, header: str = TIMEOUT_HEADER) -> float:
    """The header's seconds; ValueError (its message names the header) unless positive and
    finite."""
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise ValueError(f"{header} must be a positive number of seconds, got {raw!r}")
    return value
