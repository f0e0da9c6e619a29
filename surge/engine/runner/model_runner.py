"""Runs a step: lays the SchedulerOutput out as tensors (step_inputs.py), runs the model on the
first step path that accepts the step (step_paths/), samples.

The paths, in the order asked:
  fused_stack  4-bit models on a CPU: steps up to the stack's max_rows, LoRA rows included
  cuda_graph   a GPU's pure-decode steps, replayed from captured graphs
  compiled     pure-decode steps through torch.compile (--compile)
  eager        every other step: prefills, prompt scoring, LoRA rows the stack does not take
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from surge.engine.core.batch import SampledToken, SampledTokens, SchedulerOutput
from surge.engine.runner.config import RunnerConfig
from surge.engine.runner.cuda_graphs import DecodeGraphs
from surge.engine.runner.kv_cache import copy_blocks
from surge.engine.runner.lora_manager import LoRAManager
from surge.engine.runner.step_inputs import StepInputBuilder, StepInputs
from surge.engine.runner.step_paths import (
    CompiledPath,
    CudaGraphPath,
    EagerPath,
    FusedStackPath,
    StepBatch,
    StepPath,
)
from surge.engine.sample.prompt_logprobs import score_prompts
from surge.engine.sample.sampler import Sampler, SamplingRow
from surge.models.kernels import load_int8_linear, load_paged_decode
from surge.models.llama import LlamaForCausalLM
from surge.models.q4_decode import FusedQ4Decode


@dataclass(frozen=True, slots=True)
class RunnerCapabilities:
    """What the built runner can do, for the core to plan with (it never looks inside)."""

    fused_max_rows: int | None = None  # the fused 4-bit stack's largest step; None: no stack

    @property
    def batch_invariant(self) -> bool:
        """Whether --batch-invariant can hold: every step of up to fused_max_rows on one kernel."""
        return self.fused_max_rows is not None


class ModelRunner:
    """Built complete: its step paths, and the LoRA adapters' slots when they are served."""

    def __init__(
        self,
        *,
        model: LlamaForCausalLM,
        kv_caches: list[tuple[Tensor, Tensor]],
        sampler: Sampler,
        device: torch.device,
        config: RunnerConfig,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.sampler = sampler
        self.device = device
        self.config = config
        spec = model.spec
        # allocate_kv_cache adds one block past the pool: padded rows write their K/V there.
        bs = config.block_size
        self.scratch_slot = (kv_caches[0][0].shape[1] - 1) * bs if kv_caches else 0
        # The longest sliding window (None: every layer sees the whole context).
        windows = [w for i in range(spec.num_layers) if (w := spec.window(i)) is not None]
        self.window = max(windows, default=None)
        decode_op, write_kv_op = _attention_ops(model, kv_caches, device, config.use_kernels)
        self.builder = StepInputBuilder(
            block_size=bs,
            device=device,
            kv_caches=kv_caches,
            scratch_slot=self.scratch_slot,
            window=self.window,
            decode_op=decode_op,
            write_kv_op=write_kv_op,
        )
        self._eager = EagerPath(model, device)
        self._fused: FusedStackPath | None = None
        self._graphs: CudaGraphPath | None = None
        self._compiled = CompiledPath(model, device) if config.compile else None
        on_cpu_kernels = config.use_kernels and device.type == "cpu"
        fused = None
        if config.fused_decode and on_cpu_kernels and spec.llama_block:
            fused = FusedStackPath.build(model, kv_caches)
        # A GPU's decode steps replay CUDA graphs (eager ones: --compile keeps its own graphs);
        # the graphs replay the whole-context decode only (sliding windows: eager steps).
        on_gpu = config.cuda_graphs and device.type == "cuda" and not config.compile
        graphs = None
        if on_gpu and self.window is None:
            max_blocks = -(-config.max_model_len // bs)
            graphs = DecodeGraphs(
                model, kv_caches, bs, config.max_num_seqs, max_blocks, self.scratch_slot, device
            )
        self.use_paths(fused=fused, graphs=graphs)
        self.capabilities = RunnerCapabilities(fused.max_rows if fused is not None else None)
        # After the paths: the fused stack and CUDA graphs hold the base layers, and steps with
        # adapters run eagerly through the wrappers (or on the stack, which reads the slots).
        self.loras: LoRAManager | None = None
        if config.lora is not None:
            # The fused 4-bit stack computes in float32 and reads the slots as they are.
            lora_dtype = torch.float32 if fused is not None else dtype
            self.loras = LoRAManager(model, spec, config.lora, lora_dtype, device)
            if fused is not None:
                fused.set_lora(self.loras.lora)
            for name, path in config.lora.adapters:
                self.loras.add(name, path)
            self._eager.lora_batch = self.loras.batch

    # ---- the paths ---------------------------------------------------------------------------
    def _order(self) -> None:
        paths = (self._fused, self._graphs, self._compiled)
        self.paths: tuple[StepPath, ...] = (*(p for p in paths if p is not None), self._eager)

    def use_paths(self, *, fused: FusedQ4Decode | None, graphs: DecodeGraphs | None) -> None:
        """The accelerated paths a step may take before the eager one (the constructor's
        choice; the path-selection tests swap in stand-ins)."""
        batch_invariant = self.config.batch_invariant
        self._fused = FusedStackPath(fused, batch_invariant) if fused is not None else None
        self._graphs = CudaGraphPath(graphs) if graphs is not None else None
        self._order()

    @property
    def fused(self) -> FusedQ4Decode | None:
        """The fused 4-bit stack (None: not on this model or device)."""
        return self._fused.fused if self._fused is not None else None

    @property
    def graphs(self) -> DecodeGraphs | None:
        """The CUDA graphs of decode steps (None: not on this device or with these options)."""
        return self._graphs.graphs if self._graphs is not None else None

    @property
    def _compiled_buckets(self) -> set[int]:
        return self._compiled.buckets if self._compiled is not None else set()

    def step_batch(self, batch: SchedulerOutput) -> StepBatch:
        requests = batch.requests
        lora = self._eager.lora_batch is not None and any(r.lora_slot >= 0 for r in requests)
        return StepBatch(batch, any(r.prompt_targets for r in requests), lora)

    def path_for(self, step: StepBatch) -> StepPath:
        for path in self.paths:
            if path.accepts(step):
                return path
        return self._eager

    # ---- the step ----------------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, batch: SchedulerOutput) -> SampledTokens:
        copy_blocks(self.kv_caches, batch.kv_copies)  # partial prefix hits, before any write
        if batch.is_empty:
            return SampledTokens({})
        step = self.step_batch(batch)
        path = self.path_for(step)
        inputs = self.builder.build(batch, path.layout(step))
        return self._sample(inputs, path.run(inputs))

    def _sample(self, inputs: StepInputs, logits: Tensor) -> SampledTokens:
        sample_reqs = inputs.sample_reqs
        n = len(sample_reqs)
        # Rows past the sampled ones: prompt-scoring rows, then padding.
        prompt_logprobs = score_prompts(logits[n:], inputs.scored) if inputs.scored else {}
        if logits.shape[0] != n:
            logits = logits[:n]
        # A request with a draft has a row per position: `sampling`, then its draft rows.
        rows: list[SamplingRow] = []
        j = 0  # the position within the current request's rows
        for i, r in enumerate(sample_reqs):
            j = j + 1 if i > 0 and sample_reqs[i - 1] is r else 0
            assert r.sampling is not None
            rows.append(r.sampling if j == 0 else r.draft_sampling[j - 1])
        out = self.sampler(logits, rows)
        tokens: dict[str, SampledToken] = {}
        drafts: dict[str, list[SampledToken]] = {}
        for i, sreq in enumerate(sample_reqs):
            top = out.top_logprobs[i]
            tok = SampledToken(
                out.token_ids[i], out.logprobs[i], tuple(top) if top is not None else None
            )
            if sreq.req_id in tokens:
                drafts.setdefault(sreq.req_id, []).append(tok)
            else:
                tokens[sreq.req_id] = tok
        return SampledTokens(tokens, drafts, prompt_logprobs)

    @torch.inference_mode()
    def warm_up(self) -> float:
        """Compile every decode graph now (--compile), so that no request stalls for a compile;
        returns the seconds spent."""
        if self._compiled is None:
            return 0.0
        return self._compiled.warm_up(self.builder, self.capabilities.fused_max_rows or 0)


def _attention_ops(
    model: LlamaForCausalLM,
    kv_caches: list[tuple[Tensor, Tensor]],
    device: torch.device,
    use_kernels: bool,
) -> tuple[Callable[..., Tensor] | None, Callable[..., None] | None]:
    """The compiled paged-decode and K/V-write ops where they serve (a CPU with the kernels
    built; for an int8 cache, a head size the op has), else (None, None): torch ops."""
    if not use_kernels or device.type != "cpu":
        return None, None
    ops: tuple[Callable[..., Tensor] | None, Callable[..., None] | None] = (None, None)
    int8_kv = bool(kv_caches) and kv_caches[0][0].dtype == torch.int8
    if load_paged_decode() is not None and (
        not int8_kv or model.spec.head_dim in (64, 128, 256)  # the op's int8 head sizes
    ):
        ops = (torch.ops.surge.paged_decode, torch.ops.surge.write_kv)
    load_int8_linear()  # registers its ops' shapes for torch.compile
    return ops
