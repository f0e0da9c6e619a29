"""The model layer by layer, no graphs: every step can run so (the last path asked). The one
path for steps with LoRA rows the fused stack does not take (graphs hold the base layers only)
and for prompt scoring (a row of logits for every prompt position scored)."""

from __future__ import annotations

import torch
from torch import Tensor

from surge.engine.runner.step_inputs import StepInputs, StepLayout
from surge.engine.runner.step_paths.base import StepBatch
from surge.models.llama import LlamaForCausalLM
from surge.models.lora import LoRABatch


class EagerPath:
    name = "eager"

    def __init__(self, model: LlamaForCausalLM, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.lora_batch: LoRABatch | None = None  # set when LoRA adapters are served

    def accepts(self, step: StepBatch) -> bool:
        return True

    def layout(self, step: StepBatch) -> StepLayout:
        return StepLayout(score=step.scoring, lora_slots=step.lora)

    def run(self, inputs: StepInputs) -> Tensor:
        if inputs.row_slots is None:
            return self.model(inputs.input_ids, inputs.positions, inputs.attn)
        # Adapters in the step: through the LoRA wrappers, each row to its slot.
        assert self.lora_batch is not None
        self.lora_batch.set_rows(inputs.row_slots, self.device)
        try:
            return self.model(inputs.input_ids, inputs.positions, inputs.attn)
        finally:
            self.lora_batch.clear()
