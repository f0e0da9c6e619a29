"""A GPU's pure-decode steps replayed from captured CUDA graphs
(surge/engine/runner/cuda_graphs.py):
rows padded to a graph's bucket, no mask (the graphs make theirs from the lengths). Base layers
only: no LoRA rows, no prompt scoring; whole-context models only (sliding windows: eager)."""

from __future__ import annotations

from torch import Tensor

from surge.engine.runner.cuda_graphs import DecodeGraphs
from surge.engine.runner.step_inputs import StepInputs, StepLayout
from surge.engine.runner.step_paths.base import StepBatch


class CudaGraphPath:
    name = "cuda_graph"

    def __init__(self, graphs: DecodeGraphs) -> None:
        self.graphs = graphs

    def accepts(self, step: StepBatch) -> bool:
        requests = step.batch.requests
        if step.scoring or step.lora or not all(r.is_decode for r in requests):
            return False
        blocks = max(len(r.block_table) for r in requests)
        return self.graphs.rows_for(len(requests), blocks) is not None

    def layout(self, step: StepBatch) -> StepLayout:
        rows = self.graphs.rows_for(len(step.batch.requests))  # the tables fit: accepts
        return StepLayout(pad_to=rows, mask=False)

    def run(self, inputs: StepInputs) -> Tensor:
        return self.graphs(inputs.input_ids, inputs.positions, inputs.attn)
