"""The argument types `surge autoscale simulate` and `recommend` share: argparse's errors for
bad durations, SLOs and batch specs."""

from __future__ import annotations

import argparse

from surge.bench.config import Slo
from surge.fleetsim.batch import BatchSpec, parse_span


def duration(text: str) -> float:
    """bench's durations (2s, 100ms, 5m, 1.5) plus hours and days (6h, 1d) and HH:MM."""
    try:
        return parse_span(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def batch_spec(text: str) -> BatchSpec:
    try:
        return BatchSpec.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def slo(text: str) -> Slo:
    try:
        return Slo.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
