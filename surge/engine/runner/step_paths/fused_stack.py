"""The fused 4-bit stack (4-bit models on a CPU with the compiled kernels): a step of up to its
max_rows rows in one call, prefill chunks up to its max_chunk tokens as rows of their own, and
LoRA rows where adapters were set on it. Not prompt scoring (it computes sampled rows only)."""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from surge.config.settings import settings
from surge.engine.runner.step_inputs import StepInputs, StepLayout
from surge.engine.runner.step_paths.base import StepBatch
from surge.models.llama import LlamaForCausalLM
from surge.models.q4_decode import FusedQ4Decode

log = logging.getLogger(__name__)


class FusedStackPath:
    name = "fused_stack"

    def __init__(self, fused: FusedQ4Decode, batch_invariant: bool = False) -> None:
        self.fused = fused
        # Every step on the batch-invariant twin (else only steps with a request that asks
        # for it, SamplingParams.batch_invariant).
        self.batch_invariant = batch_invariant
        # Prefill rows attend in tiles where the stack can (kernels/prefill_attention.h);
        # SURGE_TILED_PREFILL=0 attends every row alone, for A/B measurements.
        self.tiled_prefill = settings().tiled_prefill

    @staticmethod
    def build(
        model: LlamaForCausalLM, kv_caches: list[tuple[Tensor, Tensor]]
    ) -> FusedQ4Decode | None:
        """The stack for this model and its caches (None: the model has none); with its
        batch-invariant twin (a few MB of step buffers), for requests that ask."""
        fused = FusedQ4Decode.build(model, kv_caches, batch_invariant=True)
        if fused is not None:
            log.info("decode steps of up to %d requests: fused stack", fused.max_rows)
        return fused

    def accepts(self, step: StepBatch) -> bool:
        if step.scoring or (step.lora and not self.fused.has_lora):
            return False
        rows = 0
        for r in step.batch.requests:
            n = len(r.token_ids)
            if not r.is_decode and n > self.fused.max_chunk:
                return False
            rows += n
        return rows <= self.fused.max_rows

    def layout(self, step: StepBatch) -> StepLayout:
        return StepLayout(chunks_as_rows=True, lora_slots=step.lora)

    def run(self, inputs: StepInputs) -> Tensor:
        slots = torch.tensor(inputs.row_slots) if inputs.row_slots is not None else None
        invariant = self.batch_invariant or any(r.batch_invariant for r in inputs.requests)
        decodes = inputs.num_decodes if self.tiled_prefill else -1
        return self.fused(
            inputs.input_ids, inputs.positions, inputs.attn, slots, invariant, decodes
        )
