"""One row of a step's logits as the sampler sees it: the request's settings and tokens so far.

Plain data (no torch), so that the scheduler can describe a step without importing the sampler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from surge.sampling_params import SamplingParams

BadWords = tuple[tuple[int, ...], ...]  # a request's bad_words as token sequences


@dataclass(frozen=True, slots=True)
class SamplingRow:
    """One row of logits to sample from."""

    params: SamplingParams
    seed: int  # effective seed (the engine picks a random one when params.seed is None)
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]  # tokens generated so far by this request
    grammar: Any = None  # an llguidance matcher: only tokens it allows may be picked
    bad_words: BadWords = ()  # the request's bad_words as token sequences
