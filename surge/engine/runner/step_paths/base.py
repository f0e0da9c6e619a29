"""What every step path is: `accepts` a step (a cheap check), names the tensor layout it
needs, and runs the model on the tensors built to it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from surge.engine.core.batch import SchedulerOutput
from surge.engine.runner.step_inputs import StepInputs, StepLayout


@dataclass(frozen=True, slots=True)
class StepBatch:
    """A step as the paths see it: the scheduled requests, and the two facts every path's
    choice depends on, found once per step by the runner."""

    batch: SchedulerOutput
    scoring: bool  # a row scores prompt logprobs (needs every prompt row's logits)
    lora: bool  # a row runs through a LoRA adapter


class StepPath(Protocol):
    name: str

    def accepts(self, step: StepBatch) -> bool:
        """Whether this path takes the step; called in the runner's order, so a path may count
        on the ones before it having declined."""
        ...

    def layout(self, step: StepBatch) -> StepLayout:
        """The tensor layout this path needs for an accepted step."""
        ...

    def run(self, inputs: StepInputs) -> Tensor:
        """Logits [rows of attn.logits_indices, vocab]: sampled rows first, then scored rows,
        then any padding rows."""
        ...
